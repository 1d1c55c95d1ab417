"""The judge agent's step: score records in; dead letters and the store's answers out.

No Kafka here: the agent reads records, calls :func:`judge_records`, sends the
letters to the DLQ and flushes the outboxes of the routes :attr:`Judged.routes`
names. The fold goes through the :class:`~quantdrift.breaker.protocol.BreakerStore`
protocol, so the step runs alike on the Redis store and on the in-memory one
(``tests/unit/test_judging.py`` drives it there, without a broker or a Redis).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from quantdrift.breaker.outbox import Outbox
from quantdrift.breaker.policy import Policy
from quantdrift.breaker.protocol import BreakerStore, FoldResult
from quantdrift.errors import BreakerStoreError
from quantdrift.schemas import CommandVerifier, DeadLetter, ScoreEvent
from quantdrift.streams.handlers import RawRecord, parse_score

log = logging.getLogger("quantdrift.worker")


@dataclass(frozen=True, slots=True)
class Judged:
    """What one batch did: the records refused (with the reason), the scores folded and
    the store's answer for each, in order."""

    dead: tuple[DeadLetter, ...] = ()
    scores: tuple[ScoreEvent, ...] = ()
    results: tuple[FoldResult, ...] = ()

    @property
    def duplicates(self) -> int:
        """Scores the store had folded before (redeliveries): they changed nothing."""
        return sum(r.status == "dup" for r in self.results)

    @property
    def outboxes(self) -> list[Outbox]:
        """One per transition: its command and its alert, queued in the store."""
        return [o for r in self.results for o in r.outboxes]

    @property
    def routes(self) -> list[str]:
        """Routes whose outbox the batch filled, in order: only they need a flush."""
        routes = [
            s.route
            for s, r in zip(self.scores, self.results, strict=True)
            if r.outboxes or r.alert or r.not_armed
        ]
        return list(dict.fromkeys(routes))


async def judge_records(
    records: Sequence[RawRecord],
    store: BreakerStore,
    policy: Policy,
    verifier: CommandVerifier,
    clock: Callable[[], float],
    max_age_s: float,
    on_store_error: Callable[[BreakerStoreError], None] = lambda exc: None,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> Judged:
    """Open every record (a score a worker's key signed, recently) and fold the scores.

    A record that is not such a score is dead-lettered with the reason, never folded.
    """
    scores: list[ScoreEvent] = []
    dead: list[DeadLetter] = []
    for rec in records:
        parsed = parse_score(rec, clock(), verifier, max_age_s)
        if isinstance(parsed, DeadLetter):
            dead.append(parsed)
        else:
            scores.append(parsed)
    if not scores:
        return Judged(tuple(dead))
    results = await fold_until_done(store, scores, policy, clock, on_store_error, sleep)
    report_readiness(scores, results)
    return Judged(tuple(dead), tuple(scores), tuple(results))


def report_readiness(scores: Sequence[ScoreEvent], results: Sequence[FoldResult]) -> None:
    """Say it when a test the route relies on abstains for want of a floor.

    Once per route and test, fleet-wide: the fold records in the route's state that
    it reported the test (``readiness.noted``) in the commit that reports it, so no
    other worker or redelivery says it again. The "not armed" alert is logged where
    it was raised, as a transition's alert is.
    """
    for score, result in zip(scores, results, strict=True):
        for notice in result.notices:
            log.warning(
                "route %s: %s; this test abstains on every pair until the floor is there "
                "(raise the route's noise share, or quantdrift calibrate)",
                score.route,
                notice,
            )
        if result.not_armed is not None:
            log.warning("%s", result.not_armed.summary)


async def fold_until_done(
    store: BreakerStore,
    scores: Sequence[ScoreEvent],
    policy: Policy,
    clock: Callable[[], float],
    on_store_error: Callable[[BreakerStoreError], None] = lambda exc: None,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> list[FoldResult]:
    """Store down: wait and retry, so no decision is lost (the offsets are not acked).

    A retried batch is safe: what the first attempt committed comes back as dup.
    """
    delay = 0.1
    while True:
        try:
            return await store.fold_batch(scores, policy.for_route, clock())
        except BreakerStoreError as exc:
            on_store_error(exc)
            log.warning("breaker store unavailable (%s); retrying in %.1fs", exc, delay)
            await sleep(delay)
            delay = min(delay * 2, 5.0)
