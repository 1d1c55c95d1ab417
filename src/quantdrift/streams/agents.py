"""The agents: the thin Faust wiring around the worker's two stages.

* score agent: pairs -> :class:`~quantdrift.streams.score_stage.ScoreStage` ->
  signed scores; bad records -> DLQ.
* judge agent: scores -> :class:`~quantdrift.streams.judge_stage.JudgeStage` ->
  commands + alerts.
* a 0.5 s timer: the judge's clock (cool-downs, any outbox left unsent).

Each agent takes batches, hands them to its stage, and exits the process on a
failure that is not the data's (``streams/exits.py`` says why an exit, not a
raise). What each stage does, and why, is in its own module.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import faust

from quantdrift.breaker.policy import Policy
from quantdrift.breaker.protocol import BreakerStore
from quantdrift.detectors import Embedder
from quantdrift.failpoints import Failpoint, no_failpoint
from quantdrift.schemas import CommandSigner, CommandVerifier
from quantdrift.streams.app import Topics
from quantdrift.streams.dead_letters import DeadLetterSink
from quantdrift.streams.delivery import Backoff
from quantdrift.streams.exits import crash_unacked
from quantdrift.streams.judge_stage import JudgeStage
from quantdrift.streams.lazy import Lazy
from quantdrift.streams.outbox_sender import OutboxSender
from quantdrift.streams.score_stage import ScoreStage
from quantdrift.streams.stats import WorkerStats

__all__ = ["Attached", "WorkerStats", "attach_agents"]


@dataclass(frozen=True, slots=True)
class Attached:
    """What the wiring built, for the process's composition root to show: the counters,
    and the store and scorer as the stages build them on first use (the status page
    reads them; ``services/worker.py`` attaches it, so the worker never imports it)."""

    stats: WorkerStats
    store: Lazy[BreakerStore]
    embedder: Lazy[Embedder | None]


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
    read_commands: Callable[[], Awaitable[list[bytes]]] | None = None,
    send_give_up_s: float = 60.0,
) -> Attached:
    """Build both stages and register the agents and the clock.

    ``send_give_up_s``: how long a score the broker refuses is sent again before the
    worker exits (``streams/delivery.py``).
    """
    stats = WorkerStats()
    store, embedder = Lazy(store_factory), Lazy(embedder_factory)
    dead_letters = DeadLetterSink(topics.dlq, stats)
    scoring = ScoreStage(
        topics,
        embedder=embedder,
        policy=policy,
        signer=signer,
        dead_letters=dead_letters,
        stats=stats,
        crash=crash_unacked,
        clock=clock,
        failpoint=failpoint,
        prompt_salt=prompt_salt,
        backoff=Backoff(give_up_s=send_give_up_s),
    )
    judging = JudgeStage(
        store=store,
        outbox=OutboxSender(topics, store, claim_ttl_ms=claim_ttl_ms, failpoint=failpoint),
        policy=policy,
        verifier=verifier,
        score_max_age_s=score_max_age_s,
        dead_letters=dead_letters,
        stats=stats,
        clock=clock,
        read_commands=read_commands,
    )

    @app.task
    async def warm_embedder() -> None:
        await scoring.warm()

    @app.agent(topics.pairs)
    async def score_agent(stream: faust.StreamT[bytes]) -> None:
        # take_events (faust-streaming >= 0.10) keeps partition/offset for the DLQ.
        batches = stream.take_events(batch_max, within=batch_within_s)  # type: ignore[attr-defined]
        async for events in batches:
            try:
                await scoring.handle(events)
            except Exception:
                crash_unacked("score agent", len(events) + scoring.in_flight)

    @app.agent(topics.scores)
    async def judge_agent(stream: faust.StreamT[bytes]) -> None:
        # Batches: two Redis round trips per route per batch, not two per score.
        batches = stream.take_events(batch_max, within=batch_within_s)  # type: ignore[attr-defined]
        async for events in batches:
            try:
                await judging.handle(events)
            except Exception:
                crash_unacked("judge agent", len(events))

    @app.timer(interval=0.5)
    async def breaker_clock() -> None:
        await judging.tick()

    return Attached(stats, store, embedder)
