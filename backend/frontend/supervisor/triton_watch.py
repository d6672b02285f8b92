"""The supervisor's watch over one Triton start (lifecycle.py), in every state:
whether to restart it, and why.

- Starting (not ready yet): a Python-backend stub of this Triton that died (a zombie it has not
  reaped: Triton 2.51 waits for a stub that dies during its model's initialisation forever,
  answering 503 for good), or the start deadline passed (a load that hangs in any other way).
- Ready: every Python model has a live stub; one missing has died (Triton does not restart it and
  fails every request of that model with "Stub process ... is not healthy").
Triton's own exit the supervisor sees itself.

The start deadline comes from how long a load takes on this machine: `START_MARGIN` times the
slowest load measured by this supervisor, at least `MIN_START_DEADLINE_S`; before any load was
measured `FIRST_START_DEADLINE_S`; or a fixed number of seconds (SPECSERVE_START_TIMEOUT_S). Each
start in a row that misses it doubles it, so a machine slower than measured is not restarted
forever.

>>> deadlines = StartDeadlines()
>>> deadlines.next()  # nothing measured yet
600.0
>>> deadlines.loaded(12.5)  # ready 12.5 s after it started
>>> deadlines.next()
60.0
>>> deadlines.loaded(40.0)
>>> deadlines.next(), deadlines.missed(), deadlines.next()
(160.0, None, 320.0)
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Optional

FIRST_START_DEADLINE_S = 600.0
MIN_START_DEADLINE_S = 60.0
START_MARGIN = 4.0
ZOMBIE_GRACE_S = 1.0  # Triton reaps a stub it stops itself at once; one dead longer died on its own


@dataclass(frozen=True)
class Stub:
    """A Python-backend stub of the watched Triton: its pid, the model it serves (None when unknown:
    a zombie's command line is gone), whether it is a zombie (dead, not reaped by Triton)."""
    pid: int
    model: Optional[str]
    zombie: bool

    @classmethod
    def from_argv(cls, pid: int, argv: list, zombie: bool) -> "Stub":
        """argv: stub, .../<model>/<version>/model.py, shm region, ..."""
        return cls(pid, Path(argv[1]).parent.parent.name, zombie)


class StartDeadlines:
    """Seconds each start of Triton gets to become ready (module docstring)."""

    def __init__(self, fixed_s: Optional[float] = None):
        self.fixed_s = fixed_s or None  # 0 / None: derived from measured loads
        self.slowest: Optional[float] = None
        self.misses = 0  # starts in a row that missed their deadline

    def next(self) -> float:
        if self.fixed_s is not None:
            base = self.fixed_s
        elif self.slowest is None:
            base = FIRST_START_DEADLINE_S
        else:
            base = max(MIN_START_DEADLINE_S, START_MARGIN * self.slowest)
        return base * 2 ** self.misses

    def loaded(self, seconds: float) -> None:
        self.slowest = max(self.slowest or 0.0, seconds)
        self.misses = 0

    def missed(self) -> None:
        self.misses += 1


class TritonWatch:
    """One start of Triton: call `check` every tick with its readiness and its stubs; it answers
    why Triton must be restarted, or None."""

    def __init__(self, python_models: Iterable[str], deadline_s: float, clock: Callable[[], float] = time.monotonic):
        self.python_models = set(python_models)
        self.deadline_s, self.clock = deadline_s, clock
        self.started = clock()
        self.ready_after: Optional[float] = None  # seconds from the start to readiness, once ready
        self.deadline_missed = False
        self._zombies: dict = {}  # pid -> when first seen dead
        self._models: dict = {}  # pid -> model, of every stub seen alive

    def check(self, ready: bool, stubs: list) -> Optional[str]:
        now = self.clock()
        self._models.update((s.pid, s.model) for s in stubs if s.model is not None)
        if self.ready_after is None and ready:
            self.ready_after = now - self.started
        if self.ready_after is not None:
            live = {s.model for s in stubs if not s.zombie}
            missing = sorted(self.python_models - live)
            return f"the Python-backend stub of model '{missing[0]}' died" if missing else None
        self._zombies = {s.pid: self._zombies.get(s.pid, now) for s in stubs if s.zombie}
        dead = sorted(pid for pid, since in self._zombies.items() if now - since >= ZOMBIE_GRACE_S)
        if dead:
            model = self._models.get(dead[0])
            which = f"of model '{model}'" if model else f"(pid {dead[0]})"
            return f"the Python-backend stub {which} died while tritonserver was loading"
        if now - self.started > self.deadline_s:
            self.deadline_missed = True
            return (f"tritonserver was not ready {self.deadline_s:.0f} s after it started (its start deadline, "
                    "SPECSERVE_START_TIMEOUT_S)")
        return None
