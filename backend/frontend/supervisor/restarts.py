"""How soon the supervisor restarts a Triton that died or must be restarted: 1, 2, 4 ... 30 s by
the restarts within the last 10 minutes, for as long as it takes (the edge answers 503 with
Retry-After meanwhile), so a crash loop (say a local client killing Triton again and again) slows
down but never ends the service. SPECSERVE_MAX_RESTARTS = n > 0 gives up after n restarts within
the window instead, for an orchestrator that restarts the container; SPECSERVE_RESTART_BACKOFF_MAX_S
caps the wait (30 s; a restart is never sooner than 1 s).

>>> policy = RestartPolicy(max_restarts=2)
>>> policy.delay(), policy.delay(), policy.delay()
(1.0, 2.0, None)
"""
from __future__ import annotations

import os
import time
from typing import Callable, Optional

MAX_RESTARTS = int(os.environ.get("SPECSERVE_MAX_RESTARTS") or 0)  # >0: give up after that many within the window
RESTART_WINDOW_S = 600.0
RESTART_BACKOFF_MAX_S = max(1.0, float(os.environ.get("SPECSERVE_RESTART_BACKOFF_MAX_S") or 30))


class RestartPolicy:
    def __init__(self, max_restarts: int = MAX_RESTARTS, window_s: float = RESTART_WINDOW_S,
                 clock: Callable[[], float] = time.monotonic, backoff_max_s: float = RESTART_BACKOFF_MAX_S):
        self.max_restarts, self.window_s, self.clock = max_restarts, window_s, clock
        self.backoff_max_s = backoff_max_s
        self.times: list = []  # clock times of the restarts within the window

    def delay(self) -> Optional[float]:
        """Seconds to wait before the next restart, counted as made, or None when max_restarts
        (> 0) are spent within the window."""
        now = self.clock()
        self.times = [t for t in self.times if now - t < self.window_s]
        if self.max_restarts > 0 and len(self.times) >= self.max_restarts:
            return None
        self.times.append(now)
        return float(min(self.backoff_max_s, 2 ** (len(self.times) - 1)))
