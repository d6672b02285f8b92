"""The supervisor's one error path: what stops a launch before anything serves. `cli.main` prints
a LaunchError's message and exits 2; the server (Triton, the edge) is then never started."""


class LaunchError(Exception):
    """Why the server cannot start (a served config it cannot serve, Triton not installed, a build
    of what the config names that failed, ...), in words for whoever ran it."""
