"""Triton entry point of the unary model: make the project importable, then delegate to backend/."""
import os
import sys
from pathlib import Path

# The stub's embedded interpreter ignores PYTHONPATH: add the project and its venv.
_ROOT = Path(os.environ.get("SPECSERVE_ROOT") or Path(__file__).resolve().parents[3])
for _p in [_ROOT, *sorted((_ROOT / ".venv" / "lib").glob("python3*/site-packages"))]:
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

from backend.frontend.triton_models.forward import TritonPythonModel  # noqa: E402,F401
