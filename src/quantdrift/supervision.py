"""Supervised background tasks: no long-lived task dies silently.

A bare ``asyncio.create_task`` whose coroutine raises keeps its exception until
someone awaits it, which for a loop meant to run forever is at shutdown: the
component stops working and nothing says so. ``Supervisor.spawn`` wraps the
loop instead:

* an unexpected exception is logged with its traceback and counted under the
  task's name (``crashes``, exported as a Prometheus counter by the owner);
* the loop is started again after a capped, jittered backoff;
* after ``give_up_after`` crashes in a row (a run shorter than ``healthy_after_s``
  counts as "in a row") the task is not restarted and is listed in ``failed``:
  the owner reports not-ready instead of serving with a dead component.

Cancellation is not a crash: ``task.cancel()`` stops the loop for good. A loop
that returns normally is done and is not restarted.

Examples
--------
>>> import asyncio
>>> async def demo():
...     sup = Supervisor(backoff_s=(0.001, 0.001))
...     runs = []
...     async def flaky():
...         runs.append(1)
...         if len(runs) < 3:
...             raise RuntimeError("boom")
...     await sup.spawn("flaky", flaky)
...     return len(runs), sup.crashes, sup.ready
>>> import logging; logging.disable(logging.CRITICAL)
>>> asyncio.run(demo())
(3, {'flaky': 2}, True)
>>> logging.disable(logging.NOTSET)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

log = logging.getLogger(__name__)


@dataclass
class Supervisor:
    """Spawns and restarts named loops; ``crashes`` and ``failed`` say how they fare."""

    backoff_s: tuple[float, float] = (0.1, 10.0)
    give_up_after: int = 20
    healthy_after_s: float = 60.0
    crashes: dict[str, int] = field(default_factory=dict)
    failed: set[str] = field(default_factory=set)

    @property
    def ready(self) -> bool:
        """False once any supervised loop was given up on."""
        return not self.failed

    def spawn(self, name: str, loop: Callable[[], Awaitable[None]]) -> asyncio.Task[None]:
        """Run ``loop()`` as a task named ``name``, restarted after each unexpected exception."""
        return asyncio.create_task(self._keep(name, loop), name=name)

    async def _keep(self, name: str, loop: Callable[[], Awaitable[None]]) -> None:
        low, high = self.backoff_s
        delay, in_a_row = low, 0
        while True:
            started = time.monotonic()
            try:
                await loop()
                return
            except asyncio.CancelledError:
                raise
            except Exception:
                self.crashes[name] = self.crashes.get(name, 0) + 1
                in_a_row = 1 if time.monotonic() - started >= self.healthy_after_s else in_a_row + 1
                if in_a_row >= self.give_up_after:
                    self.failed.add(name)
                    log.critical(
                        "task %s crashed %d times in a row; not restarted (process not ready)",
                        name,
                        in_a_row,
                        exc_info=True,
                    )
                    return
                log.exception(
                    "task %s crashed (%d so far); restarting in %.2f s",
                    name,
                    self.crashes[name],
                    delay,
                )
            await asyncio.sleep(delay * random.uniform(0.8, 1.2))
            delay = low if in_a_row <= 1 else min(high, delay * 2)


async def cancelled(task: asyncio.Task[None] | None) -> None:
    """Cancel ``task`` (if any) and wait until it has ended: the one way every component
    stops its loop, so none is left running after its ``stop()`` returns."""
    if task is None:
        return
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
