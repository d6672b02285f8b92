"""Requests whose HTTP client left, marked for the model (Triton 2.51's HTTP front end notices a
client that left only when it next writes to it)."""
from __future__ import annotations

import logging
import time
from pathlib import Path

log = logging.getLogger("specserve.edge")


class CancelMarks:
    """The cancel marks of one server: an empty file named by a request's id in `directory` (made
    by the supervisor, SPECSERVE_CANCEL_DIR) says that its HTTP client has gone. The model
    polls for it like for a gRPC cancel and removes it when the request ends; marks it never
    removes (the request had already ended, or its last send failed) are pruned here after a minute."""

    PRUNE_AGE_S, PRUNE_EVERY_S = 60.0, 10.0

    def __init__(self, directory):
        self.dir, self._pruned = Path(directory), 0.0

    def mark(self, rid: str) -> None:
        try:
            (self.dir / rid).touch()
        except OSError as e:
            log.warning("could not mark request %s cancelled: %r", rid, e)
        now = time.time()
        if now - self._pruned >= self.PRUNE_EVERY_S:
            self._pruned = now
            for p in self.dir.glob("*"):
                try:
                    if now - p.stat().st_mtime > self.PRUNE_AGE_S:
                        p.unlink()
                except OSError:
                    pass
