"""The gateway's own overload, measured: how late its event loop runs.

Every timer of the gateway (connect, read, the attempt's deadline) runs on its one
event loop. When the loop is busy (more requests than the process can serve), a
loopback connect that the kernel finished at once is noticed seconds later and
"times out": the old gateway then blamed the upstream, counted it towards
ejection, fell back to the reference (doubling its own work) and answered 502
"every upstream failed" while every upstream was healthy.

``LoopLag`` is a tick that asks to wake every ``tick_s`` and records how late it
woke. It answers two questions, both from the same measure:

* ``overloaded(now)``: the smoothed lag is at least ``max_lag_s``: a new request
  is shed at the door (503 ``overloaded`` with ``Retry-After``, counted), which is
  cheap, instead of being queued behind the others;
* ``late_since(t0, now)``: the loop ran ``max_lag_s`` late at some point since
  ``t0``: a timeout of an attempt that started at ``t0`` is then the gateway's,
  not the upstream's (no ejection, no fallback, a 503 ``overloaded``).

The state is plain and takes ``now`` as a parameter; ``run`` is the only I/O.

Examples
--------
>>> lag = LoopLag(max_lag_s=0.5, tick_s=0.05, smoothing=1.0)
>>> lag.tick_started(0.0); lag.tick_ended(0.06)  # on time (10 ms late)
>>> lag.overloaded(0.06), lag.late_since(0.0, 0.06)
(False, False)
>>> lag.tick_started(0.06); lag.tick_ended(1.0)  # the loop was busy for ~0.9 s
>>> lag.overloaded(1.0), lag.late_since(0.5, 1.0), lag.late_since(1.5, 1.6)
(True, True, False)
>>> lag.tick_started(1.0)
>>> lag.late_since(1.5, 1.7)  # this tick is 0.65 s overdue: the loop is late right now
True
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(slots=True)
class LoopLag:
    """How late the event loop wakes a ``tick_s`` sleep: smoothed, and the last late time."""

    max_lag_s: float = 0.5
    tick_s: float = 0.05
    smoothing: float = 0.3  # weight of the newest tick in the smoothed lag
    lag_s: float = 0.0
    last_late_at: float = -math.inf
    due: float | None = None  # when the running tick should wake

    def __post_init__(self) -> None:
        if self.max_lag_s <= 0 or self.tick_s <= 0 or not 0 < self.smoothing <= 1:
            raise ValueError("max_lag_s and tick_s must be > 0, smoothing in (0, 1]")

    def tick_started(self, now: float) -> None:
        self.due = now + self.tick_s

    def tick_ended(self, now: float) -> None:
        if self.due is None:
            return
        late = max(0.0, now - self.due)
        self.lag_s += self.smoothing * (late - self.lag_s)
        if late >= self.max_lag_s:
            self.last_late_at = now
        self.due = None

    def overdue(self, now: float) -> float:
        """How late the running tick already is (0 when none runs or it is not due yet)."""
        return max(0.0, now - self.due) if self.due is not None else 0.0

    def current(self, now: float) -> float:
        """The lag as known now: the smoothed one, or the running tick's if it is later."""
        return max(self.lag_s, self.overdue(now))

    def overloaded(self, now: float) -> bool:
        """Whether a new request should be shed: the loop runs ``max_lag_s`` late."""
        return self.current(now) >= self.max_lag_s

    def late_since(self, t0: float, now: float) -> bool:
        """Whether the loop ran ``max_lag_s`` late at some point since ``t0``."""
        return self.last_late_at >= t0 or self.overdue(now) >= self.max_lag_s

    async def run(self, clock: Callable[[], float] = time.monotonic) -> None:
        """Tick forever (a supervised task of the gateway)."""
        while True:
            self.tick_started(clock())
            await asyncio.sleep(self.tick_s)
            self.tick_ended(clock())
