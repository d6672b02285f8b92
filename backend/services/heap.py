"""The serving process's start-up objects, frozen out of Python's cyclic garbage collector.

A served model holds a few hundred thousand long-lived objects (the tokenizer, transformers'
modules, the drafters' tables). Every full collection walks all of them: on the 2-core Xeon
of docs/results.md one took ~86 ms, six times in 20 s of decoding at 32 sequences, each a
stall of the engine loop (~2.5% of its time, and an 86 ms hole in every stream's token
spacing). Frozen once the service has started, they are skipped by every later collection;
what requests create is still collected as before. Objects alive at the freeze are never freed
by the collector (reference counting still frees them), so it is called once, by the server,
after start-up -- not by a library.
"""
from __future__ import annotations

import gc
import logging

log = logging.getLogger("specserve")


def freeze_startup_objects() -> int:
    """Collect what start-up left behind, then freeze the rest; -> the objects frozen."""
    gc.collect()
    gc.freeze()
    frozen = gc.get_freeze_count()
    log.info("froze %d start-up objects out of the garbage collector", frozen)
    return frozen
