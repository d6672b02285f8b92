"""Build what set-up leaves out, the first time something needs it, with progress.

Set-up (scripts/setup.sh) builds only what the served default needs: the venv, llama.cpp, the
Triton server, the model, its GGUF and the served engine's step-time profile. The rest is built
here when a served config, a test or a benchmark first needs it, or all at once by
`scripts/setup.sh --all`:

    python -m build_engines.on_demand drafters [chat code chat-feature]   # model drafters
    python -m build_engines.on_demand profile --engine torch              # another engine's profile
    python -m build_engines.on_demand loadtools                           # perf_analyzer, genai-perf
    python -m build_engines.on_demand served                              # what the served config names
    python -m build_engines.on_demand llama-server                        # llama.cpp's own server (bench peer)

Everything lands under .cache/ and is built once: each build holds a file lock, so two
processes that need the same thing (the launcher and a test, say) build it once, and an
up-to-date artifact costs a file check.
"""
from __future__ import annotations

import argparse
import fcntl
import os
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Iterable, List, Optional, Sequence

from backend.drafters.artifacts import find_artifact, model_drafter
from backend.served import from_repository, read, served_needs

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / ".cache"
CHECKPOINT = CACHE / "models" / "smollm2-135m-instruct"
DRAFTER_DIR = CACHE / "drafters"
PROFILE_DIR = CACHE / "profiles"
LOADTOOLS = CACHE / "loadtools" / "bin"
MODEL_DRAFTERS = ("chat", "code", "chat-feature")  # what scripts/setup.sh --drafters builds


def log(msg: str) -> None:
    print(f"[on_demand] {msg}", flush=True)


def profile_budget_s() -> float:
    """Seconds a step-time profile may take: SPECSERVE_PROFILE_BUDGET_S, else 120."""
    return float(os.environ.get("SPECSERVE_PROFILE_BUDGET_S") or 120)


def drafter_preset() -> str:
    """quick (a few minutes: what the tests need) unless SPECSERVE_DRAFTER_PRESET says full."""
    return os.environ.get("SPECSERVE_DRAFTER_PRESET") or "quick"


@contextmanager
def build_lock(directory: Path, what: str):
    """One builder of `what` at a time across processes; the others wait, then find it built."""
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / f".{what}.lock", "w") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log(f"another process is building {what}: waiting for it")
            fcntl.flock(f, fcntl.LOCK_EX)
        yield


def ensure_drafter(name: str, drafter_dir: Path = DRAFTER_DIR, checkpoint: Path = CHECKPOINT,
                   preset: Optional[str] = None) -> Path:
    """The built model drafter `name`, distilled now (seeded, on this CPU) if none is built."""
    found = find_artifact(drafter_dir, name)
    if found is not None:
        return found
    spec = model_drafter(name)
    if spec is None:
        raise ValueError(f"{name!r} is not a model drafter (one of: {', '.join(MODEL_DRAFTERS)})")
    preset = preset or drafter_preset()
    with build_lock(drafter_dir, f"{name}-drafter"):
        found = find_artifact(drafter_dir, name)  # built while we waited
        if found is not None:
            return found
        log(f"building the model drafter {name!r} ({preset} preset; the first time only: ~1-3 min quick, "
            f"20-55 min full)")
        from .distill_drafter import build
        return build(spec[0], preset, 0, checkpoint, drafter_dir, kind=spec[1])


def ensure_profile(engine: str, checkpoint: Path = CHECKPOINT, out_dir: Path = PROFILE_DIR,
                   drafter_dir: Path = DRAFTER_DIR, model: str = "smollm2-135m",
                   budget_s: Optional[float] = None, engine_args: Sequence[str] = ()) -> None:
    """The engine's step-time profile, measured within budget_s (profile_budget_s()) unless it
    is up to date. engine_args: profile_costs' flags for the served variant (--dtype, --gguf, ...)."""
    from .profile_costs import main as profile_costs
    with build_lock(out_dir, f"{model}-{engine}-profile"):
        profile_costs(["--engine", engine, "--checkpoint", str(checkpoint), "--out-dir", str(out_dir),
                       "--drafter-dir", str(drafter_dir), "--model", model, "--repeats", "3",
                       "--budget-s", str(budget_s or profile_budget_s()), *engine_args])


def engine_args(cfg, root: Path) -> List[str]:
    """profile_costs' flags that pick the engine variant a ServerConfig serves."""
    if cfg.engine == "llama.cpp":
        return ["--gguf", str(cfg.resolve(cfg.gguf, root))] if cfg.gguf else []
    return ["--dtype", cfg.dtype] + ([] if cfg.batch_invariant else ["--no-batch-invariant"])


def load_tool(name: str) -> Path:
    """perf_analyzer or genai-perf, installed now (scripts/setup_loadtools.sh) if missing."""
    tool = LOADTOOLS / name
    if not _installed_here(tool):
        with build_lock(CACHE, "loadtools"):
            if not _installed_here(tool):
                log("installing perf_analyzer and genai-perf (scripts/setup_loadtools.sh; the first time only)")
                subprocess.run(["bash", str(ROOT / "scripts" / "setup_loadtools.sh")], check=True)
    return tool


def _installed_here(tool: Path) -> bool:
    """The wrapper exists and names this cache's real place (it holds absolute paths: written for
    another checkout sharing .cache, or before the checkout moved, it cannot run)."""
    return tool.exists() and str(LOADTOOLS.parent.resolve()) in tool.read_text(errors="replace")


def llama_server() -> Path:
    """llama.cpp's own server binary, the benchmark's peer (bench/bench_peer.py), built now from the
    pinned llama-cpp-python sdist's vendored sources (scripts/build_llama_server.sh) if not cached."""
    with build_lock(CACHE, "llama-server"):
        out = subprocess.run(["bash", str(ROOT / "scripts" / "build_llama_server.sh")], check=True,
                             stdout=subprocess.PIPE, text=True).stdout  # its progress goes to stderr
    return Path(out.strip().splitlines()[-1])


def ensure_served(cfg, root: Path) -> None:
    """Build what the served config names and set-up left out: its model drafters, then its
    engine's profile (after the drafters: the profile measures the drafter it will serve)."""
    drafters, profiles = served_needs(cfg, root)
    if not (drafters or profiles):
        return
    ckpt, drafter_dir = cfg.resolve(cfg.checkpoint, root), cfg.resolve(cfg.drafter_dir, root)
    for name in drafters:
        ensure_drafter(name, drafter_dir, ckpt)
    for engine, path in profiles:
        model = path.name.split(f"-{engine}")[0]
        log(f"measuring the {engine} engine's step-time profile for the policy ({path.name}; the first time only)")
        ensure_profile(engine, ckpt, path.parent, drafter_dir, model, engine_args=engine_args(cfg, root))


def main(argv: Optional[Iterable[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="what", required=True)
    d = sub.add_parser("drafters", help="model drafters (default: all of them)")
    d.add_argument("names", nargs="*", default=list(MODEL_DRAFTERS))
    p = sub.add_parser("profile", help="an engine's step-time profile")
    p.add_argument("--engine", choices=("llama.cpp", "torch"), default="llama.cpp")
    p.add_argument("--budget-s", type=float, default=None, help="default: SPECSERVE_PROFILE_BUDGET_S, else 120")
    sub.add_parser("loadtools", help="perf_analyzer and genai-perf")
    sub.add_parser("llama-server", help="llama.cpp's own server, the peer of bench/bench_peer.py")
    s = sub.add_parser("served", help="what the served config (model_repository/llm, SPECSERVE_*) names")
    s.add_argument("--model-repository", type=Path, default=ROOT / "model_repository")
    s.add_argument("--served-record", type=Path, default=None,
                   help="the served config the supervisor resolved (backend/served.py's record): built as it is, "
                        "not resolved again from --model-repository")
    a = ap.parse_args(list(argv) if argv is not None else None)
    if a.what == "drafters":
        for name in a.names:
            log(f"{name}: {ensure_drafter(name)}")
    elif a.what == "profile":
        ensure_profile(a.engine, budget_s=a.budget_s)
    elif a.what == "loadtools":
        for name in ("perf_analyzer", "genai-perf"):
            log(f"{name}: {load_tool(name)}")
    elif a.what == "llama-server":
        log(f"llama-server: {llama_server()}")
    else:
        ensure_served(read(a.served_record) if a.served_record else from_repository(a.model_repository), ROOT)
    return 0


if __name__ == "__main__":
    sys.exit(main())
