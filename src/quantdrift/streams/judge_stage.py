"""The judge agent's stage: score records in; folds, commands and alerts out.

One atomic store step per route and batch (``judging.judge_records``, over the
``BreakerStore`` protocol). It folds only scores a worker's key signed (see
``schemas/signing.py`` for why signing, not "fold only what this process
scored"); an unsigned, forged or stale score is dead-lettered with its reason and
counted in ``scores_refused``. Its clock (:meth:`JudgeStage.tick`, every 0.5 s
from ``agents.py``) moves cool-downs (open -> half_open) and sends any outbox a
failed flush left.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from quantdrift.breaker.policy import Policy
from quantdrift.breaker.protocol import BreakerStore
from quantdrift.errors import BreakerStoreError
from quantdrift.integrations import otel
from quantdrift.schemas import CommandVerifier
from quantdrift.streams.dead_letters import DeadLetterSink
from quantdrift.streams.handlers import RawRecord
from quantdrift.streams.judging import Judged, judge_records
from quantdrift.streams.outbox_sender import OutboxSender
from quantdrift.streams.stats import WorkerStats

log = logging.getLogger("quantdrift.worker")


class JudgeStage:
    """Judges batches of score records and ticks the routes' clocks (one per worker)."""

    def __init__(
        self,
        *,
        store: Callable[[], BreakerStore],
        outbox: OutboxSender,
        policy: Policy,
        verifier: CommandVerifier,
        score_max_age_s: float,
        dead_letters: DeadLetterSink,
        stats: WorkerStats,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._store = store
        self._outbox = outbox
        self._policy = policy
        self._verifier = verifier
        self._score_max_age_s = score_max_age_s
        self._dead_letters = dead_letters
        self._stats = stats
        self._clock = clock

    async def handle(self, events: Sequence[Any]) -> None:
        """Fold a batch of score records; refuse what is not a fresh signed score."""
        judged = await judge_records(
            [RawRecord.of_event(e) for e in events],
            self._store(),
            self._policy,
            self._verifier,
            self._clock,
            self._score_max_age_s,
            self._store_error,
        )
        await self._refuse(judged)
        if not judged.scores:
            return
        stats = self._stats
        stats.scores_judged += len(judged.scores)
        stats.duplicates += judged.duplicates
        stats.transitions += len(judged.outboxes)
        otel.judged(judged.scores, judged.results)
        for result in judged.results:
            if result.alert is not None:
                log.warning("%s", result.alert.summary)
            for outbox in result.outboxes:
                log.warning("%s", outbox.alert.summary)
        # Only a transition or a candidate change queues anything; the clock retries
        # what fails here.
        for route in judged.routes:
            await self._outbox.flush(route)

    async def tick(self) -> None:
        """Move every route's clock (cool-downs) and flush what its outbox holds."""
        try:
            store = self._store()
            for route in await store.routes():
                result = await store.tick(route, self._policy.for_route(route), self._clock())
                if result.outbox is not None:
                    self._stats.transitions += 1
                    log.warning("%s", result.outbox.alert.summary)
                    otel.transitioned(result.outbox)
                await self._outbox.flush(route)
        except BreakerStoreError as exc:
            self._stats.store_errors += 1
            log.warning("breaker clock: store unavailable (%s)", exc)

    async def _refuse(self, judged: Judged) -> None:
        for letter in judged.dead:
            self._stats.scores_refused += 1
            log.warning(
                "score refused (partition %s offset %s): %s",
                letter.partition,
                letter.offset,
                letter.error[:300],
            )
        await self._dead_letters.send(judged.dead)

    def _store_error(self, _exc: BreakerStoreError) -> None:
        self._stats.store_errors += 1
