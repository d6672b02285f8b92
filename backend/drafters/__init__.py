"""Drafters propose draft tokens; they never verify. Add one: a module + a registry line."""
from .base import DRAFTERS, Draft, Drafter, make_drafter
from . import ngram  # noqa: F401  (registers "ngram")
from . import suffix  # noqa: F401  (registers "suffix")

__all__ = ["DRAFTERS", "Draft", "Drafter", "make_drafter"]
