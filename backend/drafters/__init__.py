"""Drafters propose draft tokens; they never verify. Add one: a module + a registry line.
Model drafters (backend/drafters/model.py) are built from artifacts, not registered by name."""
from .base import DRAFTERS, ContinueFn, Draft, Drafter, DraftRequest, make_drafter
from . import ngram  # noqa: F401  (registers "ngram")
from . import suffix  # noqa: F401  (registers "suffix")
from . import grammar  # noqa: F401  (registers "grammar")

__all__ = ["DRAFTERS", "ContinueFn", "Draft", "Drafter", "DraftRequest", "make_drafter"]
