"""The docs follow the code: docs/architecture.md names every module of the runtime and the
offline builds, and every relative link in the README and docs/ leads to a file that exists."""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ARCHITECTURE = (ROOT / "docs" / "architecture.md").read_text()
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


@pytest.mark.parametrize("folder", ["backend", "build_engines"])
def test_architecture_names_every_module(folder):
    modules = [p for p in (ROOT / folder).rglob("*.py") if p.name != "__init__.py"]
    assert modules
    assert [str(p.relative_to(ROOT)) for p in modules if p.name not in ARCHITECTURE] == []


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
