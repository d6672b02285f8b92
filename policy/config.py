"""Policy config files: YAML (or a dict) -> validated (name, params).

    policy: nightjar          # a registered policy name
    params:                   # optional; that policy's Config fields
      drafter: draft
      gamma_max: 4

`load_policy_config` checks the name, the parameter names, types and ranges
(by building the policy's frozen Config record) and raises `PolicyConfigError`
with one clear line otherwise; `policy_from_config` then builds the policy.
"""
from __future__ import annotations

from typing import Any, Mapping, Tuple, Union

import yaml

from . import POLICIES, make_policy
from .params import PolicyConfigError, build_config

__all__ = ["PolicyConfigError", "load_policy_config", "policy_from_config"]


def _read(path_or_dict: Union[str, Mapping[str, Any]]) -> Mapping[str, Any]:
    if isinstance(path_or_dict, Mapping):
        return path_or_dict
    try:
        with open(path_or_dict) as f:
            doc = yaml.safe_load(f)
    except OSError as e:
        raise PolicyConfigError(f"cannot read policy config {str(path_or_dict)!r}: {e.strerror}") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise PolicyConfigError(f"policy config {str(path_or_dict)!r} is not valid YAML{where}") from None
    if not isinstance(doc, Mapping):
        raise PolicyConfigError(f"policy config {str(path_or_dict)!r} must be a mapping with a 'policy' key")
    return doc


def load_policy_config(path_or_dict: Union[str, Mapping[str, Any]]) -> Tuple[str, dict]:
    """-> (policy name, validated params as a plain dict)."""
    doc = _read(path_or_dict)
    extra = sorted(set(doc) - {"policy", "params"})
    if extra:
        raise PolicyConfigError(f"unknown top-level key(s) {', '.join(map(str, extra))}; expected 'policy' and 'params'")
    name = doc.get("policy")
    if isinstance(name, bool):
        raise PolicyConfigError("'policy' is a YAML boolean; quote the name, e.g. policy: \"off\"")
    if not isinstance(name, str):
        raise PolicyConfigError("policy config needs 'policy: <name>'")
    if name not in POLICIES:
        raise PolicyConfigError(f"unknown policy {name!r}; known: {', '.join(sorted(POLICIES))}")
    params = doc.get("params") or {}
    if not isinstance(params, Mapping):
        raise PolicyConfigError(f"policy {name!r}: 'params' must be a mapping")
    cfg = build_config(POLICIES[name].Config, params, name)
    return name, {k: getattr(cfg, k) for k in params}


def policy_from_config(path_or_dict, **runtime):
    """Load, validate and build; `runtime` passes clock=/rng=/profile=... through."""
    name, params = load_policy_config(path_or_dict)
    return make_policy(name, **params, **runtime)
