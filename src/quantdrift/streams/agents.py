"""The agents: read, call a pure step, write, send. Nothing more.

* score agent: pairs -> (batched embeddings) -> signed scores; bad records -> DLQ.
  Two lanes (``lanes.py``): a pair the static tier settles is sent at once; the
  pairs it escalates finish on their own thread, each route's order kept, and
  every pair's record is acknowledged only after its score is sent.
* judge agent: scores -> one atomic store step per route and batch -> commands +
  alerts (the step is ``judging.judge_records``, over the ``BreakerStore`` protocol).
  It folds only scores a worker's key signed (see ``schemas/signing.py`` for why
  signing, not "fold only what this process scored"); an unsigned, forged or stale
  score is dead-lettered with its reason and counted in ``scores_refused``.
* a 0.5 s timer: cool-downs (open -> half_open) and any outbox left unsent.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import sys
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, NoReturn

import faust
import redis.asyncio as aioredis

from quantdrift.breaker.outbox import OutboxItem
from quantdrift.breaker.policy import Policy, thresholds_for
from quantdrift.breaker.protocol import BreakerStore
from quantdrift.breaker.relay import OutboxRelay
from quantdrift.breaker.store import RedisBreakerStore
from quantdrift.detectors import Embedder, FailureThresholds
from quantdrift.embedding.factory import finish_pair_scores, score_with, stage_scores
from quantdrift.embedding.tiered import Staged
from quantdrift.errors import BreakerStoreError
from quantdrift.failpoints import Failpoint, no_failpoint
from quantdrift.integrations import otel
from quantdrift.schemas import (
    CommandSigner,
    CommandVerifier,
    DeadLetter,
    Metrics,
    PairEvent,
    ScoreEvent,
)
from quantdrift.status import attach_status
from quantdrift.streams.app import Topics
from quantdrift.streams.handlers import RawRecord, parse_batch, to_scores
from quantdrift.streams.judging import judge_records
from quantdrift.streams.lanes import Held, ScoreLanes, StagedScores, Waiting

log = logging.getLogger("quantdrift.worker")
EX_SOFTWARE = 70  # sysexits.h: an internal error; the orchestrator restarts the worker


@dataclass
class WorkerStats:
    """Counters the status page and /metrics read, each said once here."""

    pairs_scored: int = 0
    """Pairs scored and sent on as signed scores."""
    dead_letters: int = 0
    """Records either agent sent to the DLQ (with the reason)."""
    scores_judged: int = 0
    """Scores the judge folded, duplicates included."""
    duplicates: int = 0
    """Scores the store had folded before: redeliveries, which change nothing."""
    scores_refused: int = 0
    """Score records not folded: unreadable, unsigned, forged or stale."""
    scoring_failures: int = 0
    """Pairs whose scoring raised even alone (dead-lettered)."""
    transitions: int = 0
    """Breaker transitions: each queued one command and one alert."""
    store_errors: int = 0
    """Times the breaker store was unavailable (each retried)."""
    batches: int = 0
    """Scored batches; ``scoring_seconds`` holds the per-pair time of the last 2048."""
    scoring_seconds: list[float] = field(default_factory=list)


def attach_agents(
    app: faust.App,
    topics: Topics,
    *,
    policy: Policy,
    store_factory: Callable[[], BreakerStore],
    signer: CommandSigner,
    verifier: CommandVerifier,
    score_max_age_s: float,
    embedder_factory: Callable[[], Embedder | None],
    batch_max: int,
    batch_within_s: float,
    clock: Callable[[], float] = time.time,
    failpoint: Failpoint = no_failpoint,
    claim_ttl_ms: int = 10_000,
    prompt_salt: str = "",
    stall_after_s: float = 60.0,
) -> WorkerStats:
    stats = WorkerStats()
    # One thread for the embedder: torch releases the GIL, the event loop keeps
    # heartbeating while a batch is embedded.
    executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="quantdrift-embed")
    # The escalation lane's own thread: MiniLM on the pairs the static tier cannot
    # settle, off the path of those it can (streams/lanes.py says why and what it keeps).
    escalation_executor = ThreadPoolExecutor(
        max_workers=1, thread_name_prefix="quantdrift-escalate"
    )
    holder: dict[str, object] = {}

    def embedder() -> Embedder | None:
        if "embedder" not in holder:
            holder["embedder"] = embedder_factory()
        return holder["embedder"]  # type: ignore[return-value]

    def store() -> BreakerStore:
        if "store" not in holder:
            holder["store"] = store_factory()
        return holder["store"]  # type: ignore[return-value]

    async def dead_letter(letters: list[DeadLetter]) -> None:
        for letter in letters:
            stats.dead_letters += 1
            key = (letter.key or "").encode() or None
            await topics.dlq.send(key=key, value=letter.dumps())

    @app.task
    async def warm_embedder() -> None:
        """Load the model before the first batch, not during it (a ~5 s stall)."""
        await asyncio.get_running_loop().run_in_executor(executor, embedder)

    @app.agent(topics.pairs)
    async def score_agent(stream: faust.StreamT[bytes]) -> None:
        # take_events (faust-streaming >= 0.10) keeps partition/offset for the DLQ.
        batches = stream.take_events(batch_max, within=batch_within_s)  # type: ignore[attr-defined]
        async for events in batches:
            try:
                await score_batch(events)
            except Exception:
                crash_unacked("score agent", len(events) + lanes.in_flight)

    def thresholds(pairs: list[PairEvent]) -> dict[str, FailureThresholds]:
        by_route: dict[str, FailureThresholds] = {}
        for p in pairs:
            by_route.setdefault(p.route, thresholds_for(policy, p.route))
        return by_route

    def stage(pairs: list[PairEvent]) -> StagedScores:
        """The static lane's step: final scores of the pairs that need no escalation."""
        for p in pairs:
            failpoint(f"score:{p.pair_id}")
        started = time.perf_counter()
        scorer = embedder()
        staged = stage_scores(scorer, pairs)
        by_route = thresholds(pairs)
        ready = {i: _score(pairs[i], m, by_route) for i, m in staged.ready.items()}
        stats.scoring_seconds.append((time.perf_counter() - started) / len(pairs))
        del stats.scoring_seconds[:-2048]
        stats.batches += 1
        return StagedScores(ready, tuple(staged.waiting), staged)

    def finish(waiting: list[Waiting]) -> list[ScoreEvent]:
        """The escalation lane's step: the full model on a few waiting pairs, one call."""
        failpoint("escalate")
        units: list[tuple[Staged, int]] = []
        for w in waiting:
            if not isinstance(w.staged.token, Staged):
                raise TypeError("a pair waiting on the escalation lane was not staged by stage()")
            units.append((w.staged.token, w.index))
        metrics = finish_pair_scores(embedder(), units)
        pairs = [token.pairs[i] for token, i in units]
        by_route = thresholds(pairs)
        return [_score(p, m, by_route) for p, m in zip(pairs, metrics, strict=True)]

    def alone(pair: PairEvent) -> ScoreEvent:
        """One pair scored whole, both tiers (a batch's step raised: find who did)."""
        failpoint(f"score:{pair.pair_id}")
        (metrics,) = score_with(embedder(), [pair])
        return _score(pair, metrics, thresholds([pair]))

    async def emit(pair: PairEvent, outcome: ScoreEvent | Exception) -> None:
        """Send a pair's signed score, or dead-letter it with why scoring it failed."""
        if isinstance(outcome, Exception):
            stats.scoring_failures += 1
            letter = DeadLetter.of(
                pair.dumps(),
                topic=topics.pairs.get_topic_name(),
                key=pair.route,
                error=f"scoring failed: {type(outcome).__name__}: {outcome}",
                now=clock(),
            )
            await dead_letter([letter])
            return
        failpoint("send_score")
        value = signer.seal_score(outcome, clock())
        await topics.scores.send(key=pair.route.encode(), value=value)
        stats.pairs_scored += 1

    lanes = ScoreLanes(
        stage=stage,
        finish=finish,
        alone=alone,
        emit=emit,
        crash=lambda lane, n: crash_unacked(lane, n),
        static_lane=executor,
        escalation_lane=escalation_executor,
    )

    async def score_batch(events: list[Any]) -> None:
        """Score a batch: bad records to the DLQ, the pairs through the two lanes.

        Each pair's record gets one more reference before the batch is handed on,
        dropped only once its score (or dead letter) is sent: ``take_events``
        acknowledges the batch when this returns, and the offset of a pair still
        waiting on the escalation lane must not be committed then.
        """
        held: list[Held] = []
        for event in events:
            pairs, dead = parse_batch([_record(event)], clock(), prompt_salt)
            await dead_letter(dead)
            for pair in pairs:
                event.message.incref()
                held.append(Held(pair, event.ack))
        await lanes.submit(held)

    def crash_unacked(agent: str, n: int) -> NoReturn:
        """An unexpected failure inside a batch: exit *before* Faust acknowledges it.

        ``take_events`` acknowledges a batch in a ``finally``, so an exception that
        leaves the agent would commit the offsets of records never scored or judged,
        and they would be lost. Exiting the process instead leaves them uncommitted:
        the next worker (or this one, restarted) reads them again, and the judge drops
        any pair id it already folded. A poison *pair* never gets here (scoring
        failures are dead-lettered one by one above); this is for what is not the
        data's fault (the broker refusing a send, a bug), where a crash is visible and
        a retry is right.
        """
        log.critical(
            "%s: unexpected failure with %d records not acknowledged; exiting (code %d) so "
            "they are redelivered",
            agent,
            n,
            EX_SOFTWARE,
            exc_info=True,
        )
        for handler in logging.getLogger().handlers:
            handler.flush()
        sys.stderr.flush()
        os._exit(EX_SOFTWARE)

    @app.agent(topics.scores)
    async def judge_agent(stream: faust.StreamT[bytes]) -> None:
        # Batches: two Redis round trips per route per batch, not two per score.
        batches = stream.take_events(batch_max, within=batch_within_s)  # type: ignore[attr-defined]
        async for events in batches:
            try:
                await judge_batch(events)
            except Exception:
                crash_unacked("judge agent", len(events))

    def store_error(_exc: BreakerStoreError) -> None:
        stats.store_errors += 1

    async def judge_batch(events: list[Any]) -> None:
        judged = await judge_records(
            [_record(e) for e in events],
            store(),
            policy,
            verifier,
            clock,
            score_max_age_s,
            store_error,
        )
        for letter in judged.dead:
            stats.scores_refused += 1
            log.warning(
                "score refused (partition %s offset %s): %s",
                letter.partition,
                letter.offset,
                letter.error[:300],
            )
        await dead_letter(list(judged.dead))
        if not judged.scores:
            return
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
            await flush_outbox(route)

    flush_lock = asyncio.Lock()
    owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"

    async def send(item: OutboxItem) -> None:
        """Return once the broker has the record: the relay trims only after that."""
        topic = topics.control if item.topic == "control" else topics.alerts
        delivered = await topic.send(key=item.route.encode(), value=item.value)
        await delivered

    def relay() -> OutboxRelay:
        if "relay" not in holder:
            holder["relay"] = OutboxRelay(
                store(), send, owner, ttl_ms=claim_ttl_ms, failpoint=failpoint
            )
        return holder["relay"]  # type: ignore[return-value]

    async def flush_outbox(route: str) -> None:
        """Publish what transitions queued; a failure leaves it for the clock to retry."""
        async with flush_lock:
            await relay().flush(route)

    @app.timer(interval=0.5)
    async def breaker_clock() -> None:
        try:
            for route in await store().routes():
                result = await store().tick(route, policy.for_route(route), clock())
                if result.outbox is not None:
                    stats.transitions += 1
                    log.warning("%s", result.outbox.alert.summary)
                    otel.transitioned(result.outbox)
                await flush_outbox(route)
        except BreakerStoreError as exc:
            stats.store_errors += 1
            log.warning("breaker clock: store unavailable (%s)", exc)

    attach_status(
        app,
        stats,
        store,
        clock=clock,
        stall_after_s=stall_after_s,
        tiers=lambda: getattr(holder.get("embedder"), "agreement", None),
        policy=policy,
    )
    return stats


def _record(event: Any) -> RawRecord:
    """A Faust event as the pure steps take it (with what the DLQ needs to locate it)."""
    m = event.message
    return RawRecord(event.value, event.key, m.topic, m.partition, m.offset)


def _score(pair: PairEvent, metrics: Metrics, by_route: dict[str, FailureThresholds]) -> ScoreEvent:
    (score,) = to_scores([pair], [metrics], by_route[pair.route])
    return score


def redis_store_factory(
    url: str, signer, key_prefix: str, ttl: int, failpoint: Failpoint = no_failpoint
) -> Callable[[], BreakerStore]:  # type: ignore[no-untyped-def]
    """The worker's store: Redis, behind the protocol the agents are typed to."""

    def make() -> BreakerStore:
        client = aioredis.Redis.from_url(
            url, socket_timeout=2.0, socket_connect_timeout=2.0, health_check_interval=5
        )
        return RedisBreakerStore(
            client, signer, key_prefix=key_prefix, seen_ttl_s=ttl, failpoint=failpoint
        )

    return make
