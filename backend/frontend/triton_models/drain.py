"""Shutdown as the model sees it: the launcher's drain file (SPECSERVE_DRAIN_FILE)."""
from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Optional

from .sink import ResponseWriter
from ...services import Service

log = logging.getLogger("specserve")


class DrainWatcher:
    """Shutdown begins when the supervisor (backend/frontend/supervisor/lifecycle.py) writes the file named by
    SPECSERVE_DRAIN_FILE, holding the seconds in-flight requests may still run. From then on
    the model refuses new requests on every protocol (UNAVAILABLE, "server shutting down"),
    and the service lets those in flight finish for that long, then fails the rest; once nothing
    is in flight it writes `<file>.done`, so the launcher stops Triton without waiting longer."""

    def __init__(self, path: str, service: Service, period_s: float = 0.05, writer: Optional[ResponseWriter] = None):
        self.path, self.service, self.period_s, self.writer = Path(path), service, period_s, writer
        self.draining = False
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="drain-watch", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            try:
                if not self.draining:
                    try:
                        text = self.path.read_text().strip()
                    except OSError:
                        continue
                    try:
                        seconds = float(text or 0)
                    except ValueError:
                        seconds = 0.0
                    self.draining = True
                    log.warning("shutdown: refusing new requests; in-flight ones have %.1f s to finish", seconds)
                    self.service.drain(seconds)
                elif self.service.idle and (self.writer is None or self.writer.queue.empty()):
                    self.path.with_name(self.path.name + ".done").write_text("drained\n")
                    log.warning("shutdown: nothing in flight")
                    return
            except Exception:
                log.exception("drain watcher failed")

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(2)
