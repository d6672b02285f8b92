"""Small immutable validated config records, one per policy.

A policy declares `Config`, a frozen dataclass whose fields are its parameters
(with defaults) and whose `check()` raises `PolicyConfigError` for values out of
range. `build_config` turns a plain dict (from YAML or keyword arguments) into
that record: unknown keys, wrong types and out-of-range values all become one
clear `PolicyConfigError` line, never a traceback from deep inside a policy.
"""
from __future__ import annotations

import dataclasses
import typing
from typing import Any, Mapping, Optional, Tuple


class PolicyConfigError(ValueError):
    """A policy config that cannot be used; the message is one human-readable line."""


def require(ok: bool, policy: str, message: str) -> None:
    if not ok:
        raise PolicyConfigError(f"policy {policy!r}: {message}")


def in_range(policy: str, name: str, value, lo=None, hi=None) -> None:
    """Check lo <= value <= hi (either bound may be None)."""
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        lo_s = "-inf" if lo is None else lo
        hi_s = "inf" if hi is None else hi
        raise PolicyConfigError(f"policy {policy!r}: {name}={value!r} out of range [{lo_s}, {hi_s}]")


def _coerce(policy: str, name: str, value: Any, hint: Any) -> Any:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Union:  # Optional[X]
        if value is None:
            return None
        inner = [a for a in args if a is not type(None)]
        return _coerce(policy, name, value, inner[0])
    if origin in (tuple, Tuple):
        if not isinstance(value, (list, tuple)):
            raise PolicyConfigError(f"policy {policy!r}: {name} must be a list, got {value!r}")
        item = args[0] if args else Any
        return tuple(_coerce(policy, f"{name}[{i}]", v, item) for i, v in enumerate(value))
    if hint is bool:
        if not isinstance(value, bool):
            raise PolicyConfigError(f"policy {policy!r}: {name} must be true/false, got {value!r}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise PolicyConfigError(f"policy {policy!r}: {name} must be an integer, got {value!r}")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise PolicyConfigError(f"policy {policy!r}: {name} must be a number, got {value!r}")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise PolicyConfigError(f"policy {policy!r}: {name} must be a string, got {value!r}")
        return value
    return value


def build_config(config_cls, params: Optional[Mapping[str, Any]], policy: str):
    """dict -> validated frozen config record of type `config_cls`.

    >>> from policy.static import StaticConfig
    >>> build_config(StaticConfig, {"gamma": 3}, "static")
    StaticConfig(drafter='ngram', gamma=3)
    """
    params = dict(params or {})
    hints = typing.get_type_hints(config_cls)
    names = [f.name for f in dataclasses.fields(config_cls)]
    unknown = sorted(set(params) - set(names))
    if unknown:
        known = ", ".join(names) or "(none)"
        raise PolicyConfigError(f"policy {policy!r}: unknown parameter(s) {', '.join(unknown)}; known: {known}")
    values = {k: _coerce(policy, k, v, hints[k]) for k, v in params.items()}
    cfg = config_cls(**values)
    check = getattr(cfg, "check", None)
    if check is not None:
        check(policy)
    return cfg


@dataclasses.dataclass(frozen=True)
class NoParams:
    """Config of a policy without parameters."""
