"""Test shorthands over backend.loop.offline (the real engine loop, run synchronously)."""
from pathlib import Path

from backend.loop.offline import ListSink, make_loop, run_all  # noqa: F401
from backend.generation.request import GenerationRequest


def greedy(prompt, max_tokens=32, **kw):
    return GenerationRequest(prompt=prompt, max_new_tokens=max_tokens, exclude_input_in_output=True, **kw)


def served_policy(name: str, **config):
    """Policy `name` built from its example config (configs/policies) the way the server builds
    it (backend/served_policy.load_policy: profile paths filled in for the engine the config names)."""
    from backend.server_config import ServerConfig
    from backend.served_policy import load_policy
    root = Path(__file__).resolve().parents[1]
    return load_policy(ServerConfig(policy=f"configs/policies/{name}.yaml", **config), root)
