"""A supervisor for the rig's workers: a worker that exits is started again, as systemd
(``Restart=on-failure``) or a Kubernetes Deployment would, and every restart is recorded.

Exit 70 is the worker's designed way out when a score cannot be delivered for
``worker.stall_after_s`` (``streams/delivery.py``): the pair stays unacknowledged,
and the worker started in its place reads it again. Without a supervisor a cut
longer than that bound ends the run with a dead worker, which production would
not have. The fault is not hidden: each exit is a ``Restart`` with its time and
exit status, and the case's row reports it (``fault_run``).

Bounded as systemd's ``StartLimitBurst`` is: at most ``burst`` restarts; past that
the worker stays down and ``gave_up`` says so. A clean exit (status 0) is not a
failure and is not restarted.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from subprocess import Popen


@dataclass(frozen=True)
class Restart:
    """One exit the supervisor saw, and the start that followed it."""

    exited_at: float  # monotonic time the exit was seen
    status: int  # the exit status (negative: the signal that ended it)
    started_at: float  # monotonic time the new process was started


class Supervisor:
    """Watch one process; start it again with ``start()`` when it fails."""

    def __init__(
        self,
        start: Callable[[], Popen[bytes]],
        name: str,
        *,
        delay_s: float = 1.0,
        burst: int = 5,
        poll_s: float = 0.1,
    ) -> None:
        self.name = name
        self._start = start
        self.delay_s = delay_s  # systemd's RestartSec
        self.burst = burst
        self.poll_s = poll_s
        self.restarts: list[Restart] = []
        self.gave_up = False
        self.clean_exit = False
        self.proc = start()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name=f"supervise-{name}", daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._stop.wait(self.poll_s):
            status = self.proc.poll()
            if status is None:
                continue
            if status == 0:
                self.clean_exit = True
                return
            exited = time.monotonic()
            if len(self.restarts) >= self.burst:
                self.gave_up = True
                return
            if self._stop.wait(self.delay_s):
                return
            self.proc = self._start()
            self.restarts.append(Restart(exited, status, time.monotonic()))

    def stop(self) -> None:
        """Stop watching (before the process is stopped, so the stop is not restarted)."""
        self._stop.set()
        self._thread.join(10)

    def describe(self, since: float) -> list[str]:
        """One line per restart, its times from ``since`` (e.g. the fault going on)."""
        lines = [
            f"{self.name} exited {r.status} at {r.exited_at - since:+.1f}s of the fault, "
            f"restarted by the supervisor {r.started_at - r.exited_at:.1f}s later "
            f"(restart {i})"
            for i, r in enumerate(self.restarts, 1)
        ]
        if self.gave_up:
            lines.append(f"{self.name}: the supervisor gave up after {self.burst} restarts")
        return lines
