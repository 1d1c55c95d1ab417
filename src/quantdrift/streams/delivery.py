"""A record's delivery: sent until the broker confirms it, or the worker exits.

Handing a record to the producer only buffers it: the broker may still refuse it
(a fresh partition's ``AlreadyExists`` after a restart, a leader change) or never
answer (``RequestTimedOutError`` while the link is cut). The stream library then
only logs the failure, so a pair acknowledged at handoff was lost, neither judged
nor dead-lettered. The lanes therefore acknowledge a pair only once the broker has
its score, and a failed send goes through :func:`redeliver`.

Retry, then exit: a resend is safe (the judge drops pair ids it already folded, and
the resent bytes are the same signed score). Once ``give_up_s`` has passed with
every attempt failing, the worker exits with ``EX_SOFTWARE`` (``streams/exits.py``)
rather than dead-letter the pair: the DLQ is for data that cannot be scored, and a
broker that refuses or cannot take a score is not the data's fault; the DLQ goes
through that same broker anyway. An exit leaves the pair's offset uncommitted, so
the restarted worker reads it again: the same answer the worker already gives to
any failure that is not the data's. The bound is ``worker.stall_after_s``, the time
after which ``/healthz`` reports a stuck partition and a liveness probe restarts the
worker, so both ways of saying "this worker cannot make progress" agree.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

log = logging.getLogger("quantdrift.worker")

Send = Callable[[], Awaitable[Awaitable[object]]]
"""Hand a record to the producer; the awaitable it returns is the broker's answer."""


class Undelivered(Exception):
    """A record the broker would not take within the bound (the worker then exits)."""


@dataclass(frozen=True, slots=True)
class Backoff:
    """Waits between attempts: ``first_s`` doubling up to ``max_s``; give up after ``give_up_s``.

    >>> [Backoff(first_s=0.1, max_s=0.5).delay(n) for n in range(5)]
    [0.1, 0.2, 0.4, 0.5, 0.5]
    """

    first_s: float = 0.1
    max_s: float = 5.0
    give_up_s: float = 60.0

    def delay(self, attempt: int) -> float:
        return min(self.max_s, self.first_s * 2**attempt)


async def redeliver(
    send: Send,
    failure: BaseException,
    *,
    what: str,
    backoff: Backoff,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> int:
    """Send again after ``failure`` until the broker confirms; return the attempts it took.

    Raises :class:`Undelivered` (from the last failure) once ``backoff.give_up_s`` has
    passed since the first failure.
    """
    started = clock()
    attempt = 0
    while True:
        if clock() - started >= backoff.give_up_s:
            raise Undelivered(
                f"{what}: not delivered after {backoff.give_up_s:.0f} s "
                f"({attempt + 1} attempts; last: {type(failure).__name__}: {failure})"
            ) from failure
        delay = backoff.delay(attempt)
        log.warning(
            "%s: send failed (%s: %s); attempt %d in %.1f s",
            what,
            type(failure).__name__,
            failure,
            attempt + 2,
            delay,
        )
        await sleep(delay)
        attempt += 1
        try:
            await (await send())
        except Exception as exc:
            failure = exc
            continue
        log.warning("%s: delivered at attempt %d", what, attempt + 1)
        return attempt + 1
