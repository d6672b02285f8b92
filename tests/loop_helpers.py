"""Test shorthands over backend.offline (the real engine loop, run synchronously)."""
from backend.offline import ListSink, make_loop, run_all  # noqa: F401
from backend.request import GenerationRequest


def greedy(prompt, max_tokens=32, **kw):
    return GenerationRequest(prompt=prompt, max_tokens=max_tokens, exclude_input_in_output=True, **kw)
