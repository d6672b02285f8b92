"""Where built model drafters live (<drafter_dir>/<name>-drafter[-quick]), without torch: the
launcher checks a served config's drafters before it starts anything."""
from __future__ import annotations

from pathlib import Path
from typing import Iterable, Optional, Tuple

DOMAINS = ("code", "chat")  # build_engines/drafter_data.DOMAINS (not imported: it imports torch)


def not_built(name: str, drafter_dir, registered: Iterable[str]) -> ValueError:
    """The error for a drafter name that is neither registered nor built, naming the command
    that builds it (the launcher builds a served config's drafters itself before it starts)."""
    return ValueError(f"unknown drafter {name!r}: not one of {', '.join(sorted(registered))} and no model drafter "
                      f"'{name}-drafter' built in {drafter_dir}; model drafters (chat, code, chat-feature) are built "
                      f"with: python -m build_engines.on_demand drafters {name} (scripts/setup.sh --drafters: all)")


def find_artifact(root: Path, name: str) -> Optional[Path]:
    """The built drafter directory for `name`: <root>/<name>-drafter, else the quick CI build."""
    for cand in (root / f"{name}-drafter", root / f"{name}-drafter-quick"):
        if (cand / "config.json").exists():
            return cand
    return None


def model_drafter(name: str) -> Optional[Tuple[str, str]]:
    """(domain, kind) of a model drafter's name ("chat", "code-feature"); None for any other name.

    >>> model_drafter("chat"), model_drafter("chat-feature"), model_drafter("ngram")
    (('chat', 'token'), ('chat', 'feature'), None)
    """
    domain, _, kind = name.partition("-")
    if domain in DOMAINS and kind in ("", "feature"):
        return domain, kind or "token"
    return None
