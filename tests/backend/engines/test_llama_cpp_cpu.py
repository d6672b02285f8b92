"""Issue 39: llama.cpp never takes its extra-buffer (repack / Intel AMX) path, which segfaults
on Sapphire-Rapids-class machines, wherever this project loads or builds llama.cpp
(backend/engines/llama_cpp_cpu.py). These check what the code asks llama.cpp for, so they
fail on any machine if a caller stops asking, not only on an AMX one."""
import re
import subprocess
import sys
from pathlib import Path

import pytest

ll = pytest.importorskip("llama_cpp")

from backend.engines import llama_cpp as engine  # noqa: E402
from backend.engines.llama_cpp_cpu import BUILD_CFLAGS, LLAMA_SERVER_ARGS, high_level_defaults, model_params  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]


def test_model_params_keep_weights_in_the_plain_layout():
    mp = model_params(ll)
    assert mp.use_extra_bufts is False and mp.n_gpu_layers == 0
    assert ll.llama_model_default_params().use_extra_bufts is True  # llama.cpp's default is the risky one


def test_the_engine_loads_with_those_params(monkeypatch, tmp_path):
    seen = {}

    def load(path, params):
        seen["params"] = params
        return None  # "could not load": the engine raises before touching the model

    monkeypatch.setattr(ll, "llama_model_load_from_file", load)
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    with pytest.raises(RuntimeError, match="could not load"):
        engine.LlamaCpp(gguf)
    assert seen["params"].use_extra_bufts is False


def test_every_model_load_in_the_project_goes_through_model_params():
    """The one place: any llama_model_load_from_file passes model_params(...), and the
    high-level Llama (benchmark peers) is built inside high_level_defaults()."""
    loads, highs = [], []
    for path in (p for top in ("backend", "build_engines", "bench", "policy", "scripts", "model_repository")
                 for p in (ROOT / top).glob("**/*.py")):
        text = path.read_text()
        loads += [(path, m) for m in re.findall(r"llama_model_load_from_file\(([^\n]*)", text)]
        highs += [(path, text) for _ in re.findall(r"\bLlama\(model_path", text)]
    assert loads, "no llama.cpp model load found: the scan is broken"
    for path, args in loads:
        assert "model_params(" in args, f"{path}: loads a model without model_params: {args}"
    for path, text in highs:
        assert "high_level_defaults()" in text, f"{path}: builds llama_cpp.Llama outside high_level_defaults()"


def test_high_level_defaults_apply_inside_only():
    import llama_cpp.llama_cpp as low
    with high_level_defaults():
        assert low.llama_model_default_params().use_extra_bufts is False
    assert low.llama_model_default_params().use_extra_bufts is True


def test_builds_leave_amx_out():
    """Set-up's llama-cpp-python build and the llama-server peer's both take their C flags from
    llama_cpp_cpu (GCC: an explicit -mno-amx-* wins over -march=native in any order)."""
    assert set(BUILD_CFLAGS.split()) >= {"-mno-amx-tile", "-mno-amx-int8", "-mno-amx-bf16"}
    for script in ("scripts/setup.sh", "scripts/build_llama_server.sh"):
        text = (ROOT / script).read_text()
        assert "backend.engines.llama_cpp_cpu cflags" in text and 'CFLAGS="$' in text, script
    out = subprocess.run(["gcc", "-march=sapphirerapids", *BUILD_CFLAGS.split(), "-dM", "-E", "-"], input="",
                         capture_output=True, text=True, check=True).stdout
    assert "__AMX_INT8__" not in out and "__AVX512VNNI__" in out


def test_the_installed_build_has_no_amx():
    """On an AMX machine a native build without the flags reports AMX_INT8 = 1 here."""
    info = ll.llama_print_system_info().decode()
    assert "AMX_INT8 = 1" not in info, info


def test_llama_server_runs_without_repack():
    sys.path.insert(0, str(ROOT / "bench"))
    from bench_peer import peer_command
    cmd = peer_command(Path("/bin/llama-server"), Path("m.gguf"), 8080, 32, 2)
    assert set(LLAMA_SERVER_ARGS) <= set(cmd) and "--no-repack" in cmd
