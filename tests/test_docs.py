"""The docs follow the code: docs/architecture.md places every module of the runtime and the
offline builds in its folder's row, every path the README and docs/ name exists, every relative
link leads to a file, and the claims architecture.md makes about the code that a test can check
hold: which modules import what, who touches sys.path, and tests/ mirroring the source tree."""
import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ARCHITECTURE = (ROOT / "docs" / "architecture.md").read_text()
TRTLLM = (ROOT / "docs" / "trtllm.md").read_text()
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SOURCE_FOLDERS = ("backend", "bench", "build_engines", "configs", "deploy", "docker", "docs", "model_repository",
                  "native", "policy", "scripts", "tests")
# A path of this repository in a page: a source folder, then path characters. One preceded by a word,
# a slash or a dot is another repository's (`tensorrtllm_backend/docs/spec_decode.md`) or a URL's.
PATH = re.compile(r"(?<![\w/.\-])((?:%s)/[\w./{}*<>-]*)" % "|".join(SOURCE_FOLDERS))


def tracked(folder: str, suffix: str = ".py"):
    return [p for p in (ROOT / folder).rglob(f"*{suffix}") if "__pycache__" not in p.parts]


def layout_rows() -> dict:
    """The Layout table: folder -> its row's text, for rows naming plain folders (`backend/loop/`)."""
    table = ARCHITECTURE.split("## Layout", 1)[1].split("\n\n", 2)[1]
    rows = {}
    for line in table.splitlines()[2:]:
        cells = line.split("|")
        for folder in re.findall(r"`([\w/]+/)`", cells[1]):
            rows[folder] = cells[2]
    return rows


def module_imports(path: Path) -> set:
    """Every module path's file imports, anywhere in it (relative imports resolved)."""
    package = path.relative_to(ROOT).with_suffix("").parts[:-1]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = list(package[: len(package) - node.level + 1]) if node.level else []
            out.add(".".join(base + ([node.module] if node.module else [])))
    return out


def imported_only_by(name: str, folders) -> set:
    return {str(p.relative_to(ROOT)) for f in folders for p in tracked(f)
            if any(m == name or m.startswith(name + ".") for m in module_imports(p))}


# -- modules and paths ------------------------------------------------------------------------------------
@pytest.mark.parametrize("folder", ["backend", "build_engines"])
def test_every_module_is_named_in_its_folders_row(folder):
    rows = layout_rows()
    missing = []
    for p in tracked(folder):
        if p.name == "__init__.py":
            continue
        rel = str(p.relative_to(ROOT))
        row = max((f for f in rows if rel.startswith(f)), key=len)  # the deepest folder with a row
        if f"`{rel[len(row):]}`" not in rows[row] and f"`{rel}`" not in rows[row]:
            missing.append(f"{rel} (row {row})")
    assert missing == []


def test_every_module_a_row_names_exists():
    rows = {f: text for f, text in layout_rows().items() if f.startswith(("backend/", "build_engines/"))}
    named = [(folder, name) for folder, text in rows.items() for name in re.findall(r"`([\w/]+\.py)`", text)]
    assert named
    assert [f"{folder}{name}" for folder, name in named if not (ROOT / folder / name).exists()
            and not (ROOT / name).exists()] == []


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_path_a_page_names_exists(page):
    missing = set()
    for path in PATH.findall(page.read_text()):
        path = path.rstrip(".,:;")
        if any(c in path for c in "{}*<>"):  # a pattern or a placeholder (tests/policy/test_*.py)
            continue
        if not (ROOT / path).exists() and subprocess.run(["git", "check-ignore", "-q", path], cwd=ROOT).returncode:
            missing.add(path)  # (a path git ignores is an output, such as bench/results/)
    assert sorted(missing) == []


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_relative_links_lead_to_files(page):
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue  # a URL, or an anchor on the same page
        path = target.split("#", 1)[0]
        if not (page.parent / path).exists():
            broken.append(target)
    assert broken == []


# -- the claims architecture.md makes about the code --------------------------------------------------------
def test_tests_mirror_the_source_tree():
    assert "| `tests/` | mirrors the source tree" in ARCHITECTURE
    tests = ROOT / "tests"
    folders = {p.parent.relative_to(tests) for p in tests.rglob("test_*.py")}
    strays = [str(f) for f in folders if f.parts and f.parts[0] != "integration" and not (ROOT / f).is_dir()]
    assert strays == []
    assert [p.name for p in tests.glob("test_*.py")] == ["test_docs.py"]  # the rest sits in its source's folder


def test_who_touches_sys_path():
    assert "Only these touch `sys.path`:" in ARCHITECTURE
    claim = ARCHITECTURE.split("Only these touch `sys.path`:", 1)[1].split("\n\n", 1)[0]
    named = set(re.findall(r"`([\w/]+/[\w]+\.py)`", claim))
    touching = {str(p.relative_to(ROOT)) for f in SOURCE_FOLDERS for p in tracked(f) if p != Path(__file__).resolve()
                and re.search(r"sys\.path\.(insert|append)|sys\.path\s*=|syspath_prepend", p.read_text())}
    models = {t for t in touching if re.fullmatch(r"model_repository/\w+/1/model\.py", t)}
    assert "Triton's `model.py` files" in claim and models
    assert named <= touching, named - touching
    assert "the tests of the benchmark scripts, which import them from `bench/`" in claim
    for t in touching - models - named:  # the tests of bench/ scripts: each puts bench/ on the path, nothing else
        inserts = re.findall(r"sys\.path\.insert\(0, (.*)\)", (ROOT / t).read_text())
        assert t.startswith("tests/") and inserts and all('"bench"' in i for i in inserts), t


def test_the_layers_import_only_downwards():
    """backend/: one folder a layer, the request's way down (drafters and policy/ beside)."""
    way_down = "front end → service → loop → one request's generation → engine"
    assert f"one folder a layer, the request's way down: {way_down}" in ARCHITECTURE
    layers = ["frontend", "services", "loop", "generation", "engines"]
    upward = []
    for p in tracked("backend"):
        parts = p.relative_to(ROOT / "backend").parts
        if len(parts) < 2 or parts[0] not in layers:
            continue
        for m in module_imports(p):
            target = m.split(".")
            if target[0] == "backend" and len(target) > 1 and target[1] in layers \
                    and layers.index(target[1]) < layers.index(parts[0]):
                upward.append(f"{p.relative_to(ROOT)} imports {m}")
    assert upward == []


def test_policy_imports_neither_torch_nor_backend():
    assert "| `policy/` | pure Python (stdlib + numpy, never torch, nothing from `backend/`)" in ARCHITECTURE
    assert imported_only_by("torch", ["policy"]) == set() and imported_only_by("backend", ["policy"]) == set()


def test_only_the_triton_adapters_import_triton_python_backend_utils():
    assert "the only modules importing `triton_python_backend_utils`" in ARCHITECTURE
    assert imported_only_by("triton_python_backend_utils", ["backend", "build_engines", "policy", "bench",
                                                           "model_repository"]) == {
        "backend/frontend/triton_models/model.py", "backend/frontend/triton_models/responses.py", "backend/frontend/triton_models/sink.py",
        "backend/frontend/triton_models/forward.py", "backend/frontend/triton_models/tokens.py"}


def test_what_the_launcher_checks_a_config_with_imports_no_torch():
    assert "(`served_policy.py`, torch-free like `served.py`, `manifest.py` and `drafters/artifacts.py`" in ARCHITECTURE
    code = ("import sys, backend.served, backend.frontend.supervisor.cli; "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_tensorrt_llm_is_imported_only_lazily_by_its_boundary_module():
    assert "`backend/services/trtllm/_api.py` is the only module that imports `tensorrt_llm`, lazily" in TRTLLM
    # no import statement anywhere; the boundary module imports it with importlib, inside functions
    assert imported_only_by("tensorrt_llm", ["backend", "build_engines", "policy", "bench"]) == set()
    code = ("import sys, importlib, pkgutil, backend.services.trtllm as t\n"
            "for m in pkgutil.iter_modules(t.__path__): importlib.import_module(t.__name__ + '.' + m.name)\n"
            "print('tensorrt_llm' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
