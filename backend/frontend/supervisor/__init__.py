"""Start the real Triton Inference Server (from the nvidia-pytriton wheel) on loopback.

    python -m backend.frontend.supervisor [--http-port 8000 --grpc-port 8001 --metrics-port 8002]

Used by scripts/serve.sh, the containers (docker/entrypoint.py) and the integration tests
(`start_server`, launch.py). This process stays as the server's supervisor and HTTP edge
(backend/frontend/edge/): clients' HTTP reaches the edge on --http-port, which enforces the
body-size and nesting limits and forwards to Triton's own HTTP on a Unix socket in this process's
private directory (mode 0700: no other local user can connect to it). gRPC and metrics are
Triton's. Model control, the repository index, shared-memory registration, logging and trace
settings are restricted over HTTP to requests carrying the header `specserve-admin-key:
$SPECSERVE_ADMIN_KEY` (checked by the edge, which passes Triton a per-start internal key instead;
unset: nobody) and closed on gRPC, so the admin key is on no command line. Every other HTTP API of
Triton needs a second per-start key (`specserve-internal-key`), which the edge adds to what it
forwards: a process of this same user that finds Triton's socket gets 403. Neither key nor that
socket is on Triton's command line (readable by every local user in /proc): they reach it in the
environment, through a small preloaded library (argv_env.c, server_secrets.py). The edge marks
requests whose HTTP client left in SPECSERVE_CANCEL_DIR (a directory of this process's, removed at
exit), which the model polls.

Lifecycle (lifecycle.py). On SIGTERM / SIGINT shutdown begins: the edge answers 503 to every new
request (readiness too), the model refuses new gRPC requests with UNAVAILABLE ("server shutting
down"; it reads the drain file this process writes, SPECSERVE_DRAIN_FILE), in-flight requests get
SPECSERVE_DRAIN_SECONDS (10) to finish and are then failed with a final error, and only then is
Triton stopped (its exit timeout, 10 s); the process exits 0 and leaves no Python-backend stub or
/dev/shm region. A second signal skips the drain. If Triton dies, it is restarted after 1, 2, 4,
... 30 s (restarts.py: the delay grows with the deaths of the last 10 minutes), its stub and
shared memory removed first (stubs.py), for as long as it takes: meanwhile the edge answers 503
with Retry-After (SPECSERVE_MAX_RESTARTS = n > 0: exit 1 after n restarts within 10 minutes
instead, for an orchestrator that restarts the container). Leftovers of a crashed predecessor (a
tritonserver on our ports whose supervisor is gone, stubs, /dev/shm regions) are cleaned at start.

Triton is watched in every state (triton_watch.py): while it loads, a Python-backend stub that
dies (Triton 2.51 would wait for it forever) or a start that passes its deadline
(SPECSERVE_START_TIMEOUT_S; by default 4x the slowest load this supervisor measured, at least
60 s, 600 s for the first) restarts it; once ready, a stub that dies does. Triton is started with
no Python code run in the child (processes.py: this process holds gRPC client threads, whose
fork handlers can abort a forked child) and dies with this process (argv_env.c).

Before Triton starts (cli.py) the served configuration is resolved once (backend/served.py) and
what it names is built (build_served.py); what cannot start is a LaunchError (errors.py), printed
with exit status 2.
"""
