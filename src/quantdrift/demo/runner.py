"""The demo: healthy pairs, then drifted ones, until the gateway's controller switches.

Everything is real: the Tansu broker, a Redis, a worker process scoring with
MiniLM, the breaker's Lua step, a signed command, a RouteController obeying it.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aioredis
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from quantdrift.breaker.policy import load_policy
from quantdrift.breaker.store import RedisBreakerStore
from quantdrift.config import Settings
from quantdrift.demo.workers import WorkerProcess
from quantdrift.embedding import build_scorer
from quantdrift.errors import QuantdriftError
from quantdrift.evaluation import ScoreCache
from quantdrift.evaluation.calibration import seed_from_pairs
from quantdrift.gateway.control.controller import RouteController
from quantdrift.kafka_clients import consumer_kwargs, producer_kwargs
from quantdrift.schemas import PairEvent, RouteCommand, ScoreEvent, unverified_score
from quantdrift.schemas.record_keys import pair_record_key
from quantdrift.schemas.signing import signer_from_settings, verifier_from_settings
from quantdrift.stack import EmbeddedStack
from quantdrift.stack.broker import create_topics

ROUTE = "cs-agent/int4"


@dataclass
class DemoResult:
    pairs: int = 0
    drift_onset_pair: int | None = None
    rollback_pair: int | None = None
    switch_latency_ms: float | None = None
    route_target_after: str | None = None
    scored: int = 0
    rule: str | None = None
    reason: str | None = None
    notes: list[str] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        return {
            "pairs": self.pairs,
            "drift_onset_pair": self.drift_onset_pair,
            "rollback_pair": self.rollback_pair,
            "switch_latency_ms": self.switch_latency_ms,
            "route_target_after": self.route_target_after,
            "rule": self.rule,
        }

    @property
    def ok(self) -> bool:
        return self.rollback_pair is not None and self.route_target_after is not None


Progress = Callable[[DemoResult, ScoreEvent | None, str], None]


async def run_demo(
    base: Settings,
    healthy: Iterator[PairEvent],
    drifted: Iterator[PairEvent],
    *,
    healthy_pairs: int = 60,
    max_drifted_pairs: int = 80,
    rate_per_s: float = 20.0,
    progress: Progress | None = None,
    startup_timeout_s: float = 180.0,
    calibration: list[PairEvent] | None = None,
) -> DemoResult:
    run_id = uuid.uuid4().hex[:8]
    with EmbeddedStack() as stack:
        settings = base.model_copy(
            update={
                "kafka": base.kafka.model_copy(
                    update={"bootstrap_servers": stack.bootstrap, "partitions": 2}
                ),
                "redis": base.redis.model_copy(
                    update={"url": stack.redis_url, "key_prefix": f"qd:demo:{run_id}:"}
                ),
                # Tansu joins a group in ~session_timeout / 2: short timeouts for the embedded
                # broker only (real Kafka refuses sessions under 6 s).
                "worker": base.worker.model_copy(
                    update={
                        "app_id": f"quantdrift-demo-{run_id}",
                        "web_port": 0,
                        "broker_session_timeout_s": 3.0,
                        "broker_heartbeat_interval_s": 0.5,
                    }
                ),
            }
        )
        topics = settings.kafka.topics
        await create_topics(
            stack.bootstrap, topics.model_dump().values(), settings.kafka.partitions
        )
        worker = WorkerProcess(settings, stack.redis_url).start()
        if calibration:
            if progress is not None:
                progress(DemoResult(), None, "calibrating: noise floor + blessed int8 baseline")
            await _calibrate(settings, stack.redis_url, calibration)
        try:
            return await _drive(
                settings,
                stack.redis_url,
                worker,
                healthy,
                drifted,
                healthy_pairs,
                max_drifted_pairs,
                rate_per_s,
                progress,
                startup_timeout_s,
            )
        finally:
            worker.stop()


async def _calibrate(settings: Settings, redis_url: str, pairs: list[PairEvent]) -> None:
    """What ``quantdrift calibrate --blessed-label int8`` does, for the demo's route.

    The floor is seeded from noise pairs and the blessed int8 run of the calibration
    prompts, scored by the worker's own scorer, before any shadow pair is sent.
    """
    policy = load_policy(settings.policy_file).for_route(ROUTE)
    noise = [p for p in pairs if p.kind == "noise"]
    blessed = [p for p in pairs if p.kind == "shadow"]
    cache = ScoreCache(await asyncio.to_thread(build_scorer, settings.embedding))
    await asyncio.to_thread(cache.fill, [*noise, *blessed])
    seed, _ = seed_from_pairs(noise, blessed, cache, policy, ROUTE)
    signer = signer_from_settings(settings.signing.active_key_id, settings.signing.keys)
    client = aioredis.Redis.from_url(redis_url, socket_timeout=5)
    try:
        store = RedisBreakerStore(client, signer, key_prefix=settings.redis.key_prefix)
        for mode, values in seed.items():
            if values:
                await store.seed_floor(ROUTE, mode, values)
    finally:
        await client.aclose()


async def _drive(
    settings: Settings,
    redis_url: str,
    worker: WorkerProcess,
    healthy: Iterator[PairEvent],
    drifted: Iterator[PairEvent],
    healthy_pairs: int,
    max_drifted_pairs: int,
    rate_per_s: float,
    progress: Progress | None,
    startup_timeout_s: float,
) -> DemoResult:
    result = DemoResult()
    topics = settings.kafka.topics
    controller = RouteController(
        settings.kafka,
        redis_url,
        verifier_from_settings(settings.signing.keys),
        key_prefix=settings.redis.key_prefix,
        routes=[ROUTE],
        poll_interval_s=0.25,
    )
    producer = AIOKafkaProducer(**producer_kwargs(settings.kafka))
    scores = AIOKafkaConsumer(
        topics.scores,
        **{**consumer_kwargs(settings.kafka), "group_id": None, "auto_offset_reset": "earliest"},
    )
    published_at: dict[str, float] = {}
    index_of: dict[str, int] = {}
    switched = asyncio.Event()
    seen_scores: dict[str, ScoreEvent] = {}
    note = (lambda msg: progress(result, None, msg)) if progress else (lambda msg: None)

    def on_change(route: str, command: RouteCommand) -> None:
        if route == ROUTE and command.action == "rollback" and not switched.is_set():
            decisive = str(command.evidence.get("decisive_pair_id", ""))
            applied = controller.applied_at(route) or time.monotonic()
            sent = published_at.get(decisive)
            result.rollback_pair = index_of.get(decisive)
            result.switch_latency_ms = round((applied - sent) * 1000, 1) if sent else None
            result.route_target_after = controller.target(route)
            result.rule = str(command.evidence.get("rule"))
            result.reason = command.reason
            switched.set()

    controller.on_change(on_change)
    await controller.start()
    await producer.start()
    await scores.start()
    reader = asyncio.create_task(_read_scores(scores, seen_scores, result, progress))
    try:
        await controller.wait_kafka_ready(30)
        interval = 1.0 / rate_per_s

        async def publish(pair: PairEvent) -> None:
            if pair.kind == "shadow":
                result.pairs += 1
                index_of[pair.pair_id] = result.pairs
            published_at[pair.pair_id] = time.monotonic()
            await producer.send_and_wait(
                topics.pairs, key=pair_record_key(pair), value=pair.dumps()
            )

        note("waiting for the worker (loading MiniLM, joining the group)...")
        first = next(healthy)
        await publish(first)
        deadline = time.monotonic() + startup_timeout_s
        while first.pair_id not in seen_scores:
            if not worker.alive():
                raise QuantdriftError("worker exited during start-up:\n" + worker.log_tail())
            if time.monotonic() > deadline:
                raise QuantdriftError("worker did not score a pair in time:\n" + worker.log_tail())
            await asyncio.sleep(0.1)
        note("healthy phase")
        while result.pairs < healthy_pairs:
            await publish(next(healthy))
            await asyncio.sleep(interval)
        result.drift_onset_pair = result.pairs + 1
        note("drifted phase")
        for _ in range(max_drifted_pairs):
            if switched.is_set():
                break
            await publish(next(drifted))
            await asyncio.sleep(interval)
        try:
            await asyncio.wait_for(switched.wait(), timeout=15)
        except TimeoutError:
            result.notes.append("no rollback within 15 s of the last drifted pair")
        note("done")
        return result
    finally:
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)
        await scores.stop()
        await producer.stop()
        await controller.stop()


async def _read_scores(
    consumer: AIOKafkaConsumer,
    seen: dict[str, ScoreEvent],
    result: DemoResult,
    progress: Progress | None,
) -> None:
    async for record in consumer:
        try:
            score = unverified_score(record.value)
        except QuantdriftError:
            continue
        seen[score.pair_id] = score
        if score.kind == "shadow":
            result.scored += 1
        if progress:
            progress(result, score, "")
