"""Fake-only: an attribute-access recorder for objects handed to the adapter, and the
executor factory the test installs (the fake LLM needs a target engine to verify with)."""
from __future__ import annotations

from typing import Callable, Dict, Optional, Set, Tuple

ACCESSES: Set[Tuple[str, str]] = set()  # (upstream class, attribute) the adapter read or wrote
KINDS: Dict[type, str] = {}  # fake class -> the upstream class it stands for
EXECUTOR_FACTORY: Optional[Callable] = None  # LLM -> executor (set by the tests; reset by tests/backend/services/conftest.py)


def stands_for(qualname: str):
    def register(cls):
        KINDS[cls] = qualname
        return cls
    return register


def record(value):
    """Wrap a fake object so every attribute access from outside is logged."""
    if type(value) in KINDS:
        return Recorded(value)
    if isinstance(value, list) and any(type(v) in KINDS for v in value):
        return [record(v) for v in value]
    return value


class Recorded:
    __slots__ = ("_target",)

    def __init__(self, target):
        object.__setattr__(self, "_target", target)

    def __getattr__(self, name):
        target = object.__getattribute__(self, "_target")
        ACCESSES.add((KINDS[type(target)], name))
        value = getattr(target, name)
        if callable(value) and not isinstance(value, type):
            return lambda *a, **kw: record(value(*a, **kw))
        return record(value)

    def __setattr__(self, name, value):
        target = object.__getattribute__(self, "_target")
        ACCESSES.add((KINDS[type(target)], name))
        setattr(target, name, value)

    # `async for` looks dunders up on the type, past __getattr__
    def __aiter__(self):
        object.__getattribute__(self, "_target").__aiter__()
        return self

    async def __anext__(self):
        return await object.__getattribute__(self, "_target").__anext__()

    def __eq__(self, other):
        return object.__getattribute__(self, "_target") == other

    __hash__ = None
