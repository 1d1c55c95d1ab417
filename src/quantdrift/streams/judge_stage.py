"""The judge agent's stage: score records in; folds, commands and alerts out.

One atomic store step per route and batch (``judging.judge_records``, over the
``BreakerStore`` protocol). It folds only scores a worker's key signed (see
``schemas/signing.py`` for why signing, not "fold only what this process
scored"); an unsigned, forged or stale score is dead-lettered with its reason and
counted in ``scores_refused``. Its clock (:meth:`JudgeStage.tick`, every 0.5 s
from ``agents.py``) moves cool-downs (open -> half_open) and sends any outbox a
failed flush left. When Redis lost its data (``BreakerStore.remembers`` is false),
the clock first rebuilds the open, half-open and locked routes from the control
topic's newest verified commands (``breaker/reseed.py``), so a route rolled back
before the loss still half-opens.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import Any

from aiokafka.errors import KafkaError

from quantdrift import otel
from quantdrift.breaker.policy import Policy
from quantdrift.breaker.protocol import BreakerStore
from quantdrift.breaker.reseed import newest, rebuild
from quantdrift.errors import BreakerStoreError, BrokerError, SchemaError, SignatureError
from quantdrift.schemas import CommandVerifier
from quantdrift.streams.dead_letters import DeadLetterSink
from quantdrift.streams.handlers import RawRecord
from quantdrift.streams.judging import Judged, judge_records
from quantdrift.streams.outbox_sender import OutboxSender
from quantdrift.streams.stats import WorkerStats

log = logging.getLogger("quantdrift.worker")

RESEED_RETRY_S = 5.0  # a failed read of the control topic is tried again after this


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
        read_commands: Callable[[], Awaitable[list[bytes]]] | None = None,
    ) -> None:
        self._store = store
        self._outbox = outbox
        self._policy = policy
        self._verifier = verifier
        self._score_max_age_s = score_max_age_s
        self._dead_letters = dead_letters
        self._stats = stats
        self._clock = clock
        self._read_commands = read_commands
        self._next_reseed = 0.0
        self._remembered = False  # this process has seen Redis hold the alive marker

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
            await self._reseed(store)
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

    async def _reseed(self, store: BreakerStore) -> None:
        """After a data loss, rebuild the routes the control topic says are not closed.

        An empty Redis cannot tell a first start from a loss, so a first start reads the
        control topic too, and only then writes the marker: writing it unread would
        skip the rebuild of a route a lost Redis had rolled back (failing open). A
        worker cut from the broker before that first read says "unknown", not "lost".
        """
        if self._read_commands is None:
            return
        if await store.remembers():
            self._remembered = True
            return
        now = time.monotonic()
        if now < self._next_reseed:
            return
        self._next_reseed = now + RESEED_RETRY_S
        try:
            raws = await self._read_commands()
        except (BrokerError, KafkaError, OSError, TimeoutError) as exc:
            if self._remembered:
                log.warning("breaker state lost; the control topic is unreadable (%s)", exc)
            else:
                log.warning(
                    "breaker state not yet confirmed (no alive marker in Redis: a first "
                    "start, or a Redis that lost its data); the control topic is unreadable "
                    "(%s); judging goes on, the read is retried",
                    exc,
                )
            return
        commands = []
        for raw in raws:
            try:
                commands.append(self._verifier.open(raw))
            except (SchemaError, SignatureError):
                continue  # not ours to rebuild from; the gateways refuse it too
        rebuilt = []
        for route, command in sorted(newest(commands).items()):
            if await store.seed(
                route, partial(rebuild, command=command, policy=self._policy.for_route(route))
            ):
                rebuilt.append(f"{route} ({command.action}, epoch {command.epoch})")
        await store.remember()
        self._remembered = True
        if rebuilt:
            log.warning(
                "breaker state was lost; rebuilt from the control topic: %s", ", ".join(rebuilt)
            )

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
