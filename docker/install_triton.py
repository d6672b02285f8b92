"""Step 2 of scripts/setup.sh, for the CPU image: NVIDIA's Triton Inference Server 2.51 from the
`nvidia-pytriton` wheel, assembled the way the supervisor (backend/frontend/supervisor/triton_command.py) expects it.

    python docker/install_triton.py nvidia-pytriton==0.7.0 /opt/specserve/.cache/triton

The wheel is fetched with pip (the registry the rest of the image comes from), without its
dependencies (they pin packages this project does not need). Only `pytriton/tritonserver/` and
`nvidia_pytriton.libs/` are kept; the Python backend is laid out as setup.sh lays it out:
`backends/python/{libtriton_python.so, triton_python_backend_utils.py,
triton_python_backend_stub}`, the stub for the running Python version.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

KEEP = ("pytriton/tritonserver/", "nvidia_pytriton.libs/")


def install(spec: str, dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", tmp, spec], check=True)
        wheel = next(Path(tmp).glob("nvidia_pytriton-*.whl"))
        with zipfile.ZipFile(wheel) as zf:
            for info in zf.infolist():
                if not info.filename.startswith(KEEP) or info.is_dir():
                    continue
                path = Path(zf.extract(info, dest))
                mode = (info.external_attr >> 16) & 0o755  # zipfile drops the unix mode; restore it
                if mode:                                   # (without group/other write)
                    os.chmod(path, mode)
    pyver = f"{sys.version_info[0]}.{sys.version_info[1]}"
    server = dest / "pytriton" / "tritonserver"
    backend = dest / "backends" / "python"
    backend.mkdir(parents=True, exist_ok=True)
    for name in ("libtriton_python.so", "triton_python_backend_utils.py"):
        shutil.copy2(server / "backends" / "python" / name, backend / name)
    stub = server / "python_backend_stubs" / pyver / "triton_python_backend_stub"
    if not stub.exists():
        raise SystemExit(f"the wheel has no Python backend stub for Python {pyver}")
    shutil.copy2(stub, backend / stub.name)
    for exe in (server / "bin" / "tritonserver", backend / stub.name):
        exe.chmod(0o755)
    print(f"[install_triton] {spec} -> {dest} (stub for Python {pyver})", flush=True)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    install(sys.argv[1], Path(sys.argv[2]))
