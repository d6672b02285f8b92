"""Build-time checks for docker/Dockerfile.trtllm: use NVIDIA's image as it is, never fight it.

    python3 docker/check_image.py snapshot FILE.json [--trtllm 1.2.]   record the image's versions
    python3 docker/check_image.py constraints REQUIREMENTS > FILE.txt  pin everything else installed
    python3 docker/check_image.py unchanged FILE.json                  fail if any recorded version moved

`snapshot` checks the packages our code imports from the image (TensorRT-LLM, torch, transformers,
tokenizers, safetensors, numpy, PyYAML, jinja2): all present, TensorRT-LLM the expected line,
numpy < 2 (Triton's Python backend breaks BYTES tensors with numpy 2; see docs/environment.md);
then it records the version of every installed distribution. `constraints` turns every installed
distribution that REQUIREMENTS does not name into an exact pin, so installing REQUIREMENTS can add
packages but never upgrade or downgrade one of the image's. `unchanged` re-reads every version
after the install: a package the image had that moved or vanished fails the build (one that
REQUIREMENTS names and the image already had included). None of this imports tensorrt_llm (that
needs a GPU driver, which a build does not have).
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

RELIED_ON = ("tensorrt_llm", "torch", "transformers", "tokenizers", "safetensors", "numpy", "PyYAML", "jinja2")


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def versions() -> dict:
    out = {}
    for name in RELIED_ON:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def installed() -> dict:
    """Every installed distribution: normalized name -> version."""
    return {norm(d.metadata["Name"]): d.version for d in metadata.distributions() if d.metadata["Name"]}


def snapshot(path: Path, trtllm_prefix: str) -> int:
    found = versions()
    missing = [n for n, v in found.items() if v is None]
    if missing:
        print(f"[check_image] the base image lacks {missing}: not a TensorRT-LLM Triton image?", file=sys.stderr)
        return 1
    if trtllm_prefix and not found["tensorrt_llm"].startswith(trtllm_prefix):
        print(f"[check_image] TensorRT-LLM {found['tensorrt_llm']} in the base image; this project is written "
              f"against {trtllm_prefix}x (docs/trtllm.md)", file=sys.stderr)
        return 1
    if int(found["numpy"].split(".")[0]) >= 2:
        print(f"[check_image] numpy {found['numpy']}: Triton's Python backend needs numpy < 2", file=sys.stderr)
        return 1
    path.write_text(json.dumps({"relied_on": found, "installed": installed()}, indent=1) + "\n")
    print(f"[check_image] base image: {found}")
    return 0


def requirement_names(path: Path) -> set:
    names = set()
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line and not line.startswith("-"):
            names.add(norm(re.split(r"[\s\[<>=!~;@]", line, maxsplit=1)[0]))
    return names


def constraints(requirements: Path) -> int:
    ours = requirement_names(requirements)
    listed = subprocess.run([sys.executable, "-m", "pip", "list", "--format=freeze"], check=True,
                            capture_output=True, text=True).stdout
    for line in listed.splitlines():
        name, sep, version = line.partition("==")
        if sep and norm(name) not in ours and re.fullmatch(r"[0-9][0-9A-Za-z.+!_-]*", version):
            print(f"{name}=={version}")
    return 0


def moved(before: dict, after: dict) -> dict:
    """Packages of `before` whose version changed or that are gone: name -> (before, after)."""
    return {n: (v, after.get(n)) for n, v in before.items() if after.get(n) != v}


def unchanged(path: Path) -> int:
    changed = moved(json.loads(path.read_text())["installed"], installed())
    if changed:
        print(f"[check_image] installing our requirements changed the image's packages: {changed}", file=sys.stderr)
        return 1
    print("[check_image] the image's packages are unchanged")
    return 0


def main(argv) -> int:
    if len(argv) >= 2 and argv[0] == "snapshot":
        prefix = argv[argv.index("--trtllm") + 1] if "--trtllm" in argv else ""
        return snapshot(Path(argv[1]), prefix)
    if len(argv) == 2 and argv[0] == "constraints":
        return constraints(Path(argv[1]))
    if len(argv) == 2 and argv[0] == "unchanged":
        return unchanged(Path(argv[1]))
    print(__doc__, file=sys.stderr)
    return 64


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
