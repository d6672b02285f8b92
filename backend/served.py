"""The served configuration, resolved once: by the launcher, before Triton starts.

The launcher reads the `llm` model's config.pbtxt parameters with SPECSERVE_* over them
(ServerConfig.load), checks the policy they name (a registered name, or a YAML file naming one
with its parameters) and writes the result as one JSON record to a file of its own; Triton's
models find it in SPECSERVE_SERVED and read it instead of parsing their parameters again, the
build of what it names gets it too (`python -m build_engines.on_demand served --served-record`,
backend/frontend/supervisor/build_served.py), and the edge and the OpenAI API get the same record
in the launcher's process. A config this cannot
resolve stops the launch with its error, before anything is started. A model Triton loads without
the launcher (no SPECSERVE_SERVED) resolves its own parameters the same way.

Torch-free, as everything the launcher imports (`served_policy.py`, `manifest.py`,
`drafters/artifacts.py`).
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path
from typing import List, Mapping, Tuple

from .drafters.artifacts import find_artifact, model_drafter
from .served_policy import policy_params
from .server_config import ServerConfig

ROOT = Path(__file__).resolve().parents[1]
SERVED_ENV = "SPECSERVE_SERVED"  # the record's path, in Triton's environment


def repository_params(model_repository: Path) -> dict:
    """The `llm` model's config.pbtxt parameters, read as Triton reads them (its protobuf)."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    config = text_format.Parse((model_repository / "llm" / "config.pbtxt").read_text(), model_config_pb2.ModelConfig())
    params = {k: v.string_value for k, v in config.parameters.items()}
    params.pop("project_root", None)  # where model.py imports from, not a setting
    return params


def resolve(params: Mapping[str, str], env: Mapping[str, str] = os.environ, root: Path = ROOT) -> ServerConfig:
    """Parameters and SPECSERVE_* -> the served config; ValueError (or PolicyConfigError, one)
    naming what is wrong: an unknown key, a bad value, two policies named, an unknown policy or a
    policy file that does not load."""
    cfg = ServerConfig.load(params, env)
    policy_params(cfg, root)  # the policy's name and its file, checked here rather than when Triton loads it
    return cfg


def from_repository(model_repository: Path = ROOT / "model_repository", env: Mapping[str, str] = os.environ,
                    root: Path = ROOT) -> ServerConfig:
    """The config the `llm` model of `model_repository` serves."""
    return resolve(repository_params(model_repository), env, root)


def write(cfg: ServerConfig, path: Path) -> Path:
    path.write_text(json.dumps(asdict(cfg), indent=1) + "\n")
    return path


def read(path: Path) -> ServerConfig:
    return ServerConfig(**json.loads(Path(path).read_text()))


def for_model(params: Mapping[str, str], env: Mapping[str, str] = os.environ, root: Path = ROOT) -> ServerConfig:
    """What a Triton model serves: the launcher's record when it wrote one, else its own
    parameters resolved."""
    path = env.get(SERVED_ENV)
    return read(Path(path)) if path else resolve(params, env, root)


def served_needs(cfg: ServerConfig, root: Path = ROOT) -> Tuple[List[str], List[Tuple[str, Path]]]:
    """What the served config names that is not built: (model drafters, [(engine, profile)]);
    build_engines/on_demand.py builds them."""
    drafter_dir = cfg.resolve(cfg.drafter_dir, root)
    drafters = [n for n in (x.strip() for x in cfg.drafters.split(",")) if n and model_drafter(n)
                and find_artifact(drafter_dir, n) is None]
    profiles = []
    if cfg.engine in ("llama.cpp", "torch"):  # trtllm's is measured inside its container
        _, _, missing = policy_params(cfg, root)
        # profile_costs writes <profile>.json and its <profile>.switch.json together
        main = {p.with_name(p.name.replace(".switch.json", ".json")) for p in missing.values()}
        profiles = [(cfg.engine, path) for path in sorted(main)]
    return drafters, profiles
