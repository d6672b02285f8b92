"""The policy a served config names, and the measured profiles it plans with (no torch, no
engine built here: the launcher checks these before it starts Triton)."""
from __future__ import annotations

import difflib
import logging
from pathlib import Path
from typing import Dict, Tuple

from policy import POLICIES, Policy, PolicyConfigError, make_policy
from policy.config import load_policy_config

from .manifest import gguf_entry
from .server_config import ServerConfig

log = logging.getLogger("specserve")

# TensorRT-LLM pads drafts, so a curve of another engine would misprice it: until its own is
# measured (profile_costs --engine trtllm), it plans with this one (docs/results.md, the H200 curve)
TRTLLM_DEFAULTS = {"profile_path": Path(__file__).resolve().parents[1] / "configs/profiles/trtllm-default.json"}


def engine_name(cfg: ServerConfig, root: Path) -> str:
    """The name (Engine.name) of the engine the config serves, without building it."""
    if cfg.engine == "llama.cpp":
        if not cfg.gguf:
            entry = gguf_entry(cfg.resolve(cfg.checkpoint, root))
            return f"llama.cpp/{entry['type'] if entry else 'unknown'}"
        # a GGUF named by path: its type from the file name (model-Q8_0.gguf, X.Q4_1.gguf)
        return f"llama.cpp/{cfg.resolve(cfg.gguf, root).stem.rsplit('.', 1)[-1].rsplit('-', 1)[-1].upper()}"
    if cfg.engine == "trtllm":
        return "trtllm"
    return "torch/bf16-variant" if cfg.dtype == "bf16" and not cfg.batch_invariant else f"torch/{cfg.dtype}"


def known_policy(name: str) -> str:
    """`name` when a policy is registered under it; else PolicyConfigError naming the closest one
    (a misspelt policy is refused at launch, not when Triton loads the model)."""
    if name in POLICIES:
        return name
    close = difflib.get_close_matches(name, sorted(POLICIES), n=1, cutoff=0.6)
    raise PolicyConfigError(f"unknown policy {name!r}" + (f"; did you mean {close[0]!r}?" if close else "")
                            + f" (registered: {', '.join(sorted(POLICIES))}; or a YAML file: configs/policies/*.yaml)")


def policy_params(cfg: ServerConfig, root: Path) -> Tuple[str, dict, Dict[str, Path]]:
    """(policy name, its parameters, the `{engine}` profiles it names that are not measured yet).
    Relative `*_path` parameters are relative to the project root, and `{engine}` in them is the
    served engine's name (torch/bf16 -> torch-bf16): each engine plans with its own measured
    curve (build_engines/profile_costs.py). Missing profiles are left out of the parameters,
    except on trtllm, where a missing step-time profile is replaced by `TRTLLM_DEFAULTS`'s."""
    if not cfg.policy_file():
        return known_policy(cfg.policy), {}, {}
    name, params = load_policy_config(str(cfg.resolve(cfg.policy, root)))
    missing = {}
    for key, value in list(params.items()):
        if key.endswith("_path") and value:
            path = cfg.resolve(str(value).replace("{engine}", engine_name(cfg, root).replace("/", "-")), root)
            if "{engine}" in str(value) and not path.exists():
                default = TRTLLM_DEFAULTS.get(key) if cfg.engine == "trtllm" else None
                if default is not None:
                    log.info("no %s at %s: the policy plans with TensorRT-LLM's default curve %s "
                             "(measure its own: python -m build_engines.profile_costs --engine trtllm)",
                             key, path, default)
                    params[key] = str(default)
                    continue
                missing[key] = path
                del params[key]
                continue
            params[key] = str(path)
    return name, params, missing


def load_policy(cfg: ServerConfig, root: Path) -> Policy:
    """The policy named by the config, with parameters from its YAML file if given. A profile
    not measured yet is left out with a warning: the policy then plans with its default curve."""
    name, params, missing = policy_params(cfg, root)
    for key, path in missing.items():
        log.warning("no %s at %s (measure it: python -m build_engines.profile_costs --engine %s); "
                    "the policy plans with its default curve", key, path, cfg.engine)
    return make_policy(name, **params)
