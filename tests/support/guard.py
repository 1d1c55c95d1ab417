"""Helpers shared by the guard-loop and fault tests: isolated settings, sending pairs,
reading what the judge folded and what reached the topics."""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import orjson
import redis.asyncio as aioredis
from aiokafka import AIOKafkaProducer

from quantdrift.breaker.state import RouteState
from quantdrift.config import (
    KafkaSettings,
    RedisSettings,
    Settings,
    TopicNames,
    WorkerSettings,
    configured_redis_url,
)
from quantdrift.demo.workers import WorkerProcess
from quantdrift.schemas import PairEvent
from quantdrift.schemas.keys import route_key
from quantdrift.schemas.signing import unverified_command
from quantdrift.stack import EmbeddedStack
from quantdrift.stack.broker import create_topics
from support.kafka import consume_n

PLUMBING_POLICY = Path(__file__).with_name("plumbing_policy.yaml")


def isolated_settings(stack: EmbeddedStack, prefix: str, partitions: int = 2) -> Settings:
    """Own topics, consumer group and Redis prefix: tests share the broker, nothing else.

    The worker runs the seeds' rule by name (``plumbing_policy.yaml``): these tests
    check the loop, not the default rule's power."""
    tag = uuid.uuid4().hex[:8]
    topics = TopicNames(
        **{name: f"t{tag}.{value}" for name, value in TopicNames().model_dump().items()}
    )
    return Settings(
        kafka=KafkaSettings(
            bootstrap_servers=stack.bootstrap, partitions=partitions, topics=topics
        ),
        redis=RedisSettings(url=stack.redis_url, key_prefix=prefix),
        worker=WorkerSettings(
            app_id=f"qdtest-{tag}",
            web_port=0,
            broker_session_timeout_s=3.0,
            broker_heartbeat_interval_s=0.5,
        ),
        policy_file=PLUMBING_POLICY,
    )


async def make_topics(settings: Settings) -> None:
    await create_topics(
        settings.kafka.bootstrap_servers,
        settings.kafka.topics.model_dump().values(),
        settings.kafka.partitions,
    )


def wait_until(predicate, timeout: float, what: str, worker: WorkerProcess | None = None) -> None:  # type: ignore[no-untyped-def]
    """Poll a condition (not a sleep for ordering): fail with the worker's log tail."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        if worker is not None and not worker.alive():
            raise AssertionError(f"worker died while waiting for {what}:\n{worker.log_tail()}")
        time.sleep(0.05)
    tail = worker.log_tail() if worker else ""
    raise AssertionError(f"timed out after {timeout}s waiting for {what}\n{tail}")


def shadow_only(pairs: Iterator[PairEvent], n: int) -> list[PairEvent]:
    return list(itertools.islice((p for p in pairs if p.kind == "shadow"), n))


def on_route(pairs: list[PairEvent], route: str, tag: str) -> list[PairEvent]:
    return [p.model_copy(update={"route": route, "pair_id": f"{tag}-{p.pair_id}"}) for p in pairs]


async def send_pairs(
    bootstrap: str,
    topic: str,
    items: list[tuple[bytes | None, bytes | None]],
    rate_per_s: float | None = None,
) -> dict[bytes, float]:
    """Produce records (paced if ``rate_per_s``); returns each value's send time (monotonic)."""
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, acks="all", linger_ms=5, max_request_size=8 * 1024 * 1024
    )
    await producer.start()
    sent: dict[bytes, float] = {}
    try:
        if rate_per_s is None:
            futures = [await producer.send(topic, value, key=key) for key, value in items]
            await asyncio.gather(*futures)
            now = time.monotonic()
            sent = {v: now for _, v in items if v is not None}
        else:
            start = time.monotonic()
            for i, (key, value) in enumerate(items):
                delay = start + i / rate_per_s - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                if value is not None:
                    sent[value] = time.monotonic()
                await producer.send(topic, value, key=key)
            await producer.flush()
    finally:
        await producer.stop()
    return sent


async def route_state(redis_url: str, prefix: str, route: str) -> RouteState:
    client = aioredis.Redis.from_url(redis_url, socket_connect_timeout=5.0, socket_timeout=5.0)
    try:
        raw = await client.hget(route_key(prefix, route, "state"), "s")
    finally:
        await client.aclose()
    return RouteState.from_json(orjson.loads(raw) if raw else None)


async def until_seen(
    settings: Settings,
    route: str,
    n: int,
    worker: WorkerProcess,
    timeout: float = 60.0,
) -> RouteState:
    """Wait until the judge has folded n shadow pairs of ``route`` (a condition, not a sleep)."""
    assert settings.redis.url is not None
    deadline = time.monotonic() + timeout
    while True:
        state = await route_state(settings.redis.url, settings.redis.key_prefix, route)
        if state.pairs_seen >= n:
            return state
        assert worker.alive(), f"worker died:\n{worker.log_tail()}"
        assert time.monotonic() < deadline, (
            f"{route}: {state.pairs_seen}/{n} pairs judged after {timeout}s\n{worker.log_tail()}"
        )
        await asyncio.sleep(0.1)


async def wait_scored(settings: Settings, worker: WorkerProcess, timeout: float = 120.0) -> None:
    """Send one throwaway pair and wait for it to be judged: the worker is up and in its group."""
    from quantdrift.demo import synthetic

    route = "warmup/int4"
    pair = on_route(shadow_only(synthetic.healthy(route, seed=0), 1), route, "warm")[0]
    await send_pairs(
        settings.kafka.bootstrap_servers,
        settings.kafka.topics.pairs,
        [(route.encode(), pair.dumps())],
    )
    await until_seen(settings, route, 1, worker, timeout=timeout)


async def records_for(
    bootstrap: str, topic: str, route: str | None = None, timeout: float = 3.0
) -> list[Any]:
    """Every record of ``topic`` (for ``route`` if given) readable within ``timeout``.

    Scores, commands and alerts are keyed by route; pairs by pair_id (any worker scores
    them), so a pair is this route's when its own ``route`` field says so.
    """
    got = await consume_n(bootstrap, topic, 1_000_000, timeout=timeout, strict=False)
    return [r for r in got if route is None or route in (key_text(r.key), route_field(r.value))]


def key_text(key: bytes | None) -> str | None:
    return key.decode("utf-8", "replace") if key is not None else None


def route_field(value: bytes | None) -> str | None:
    """The ``route`` of a JSON record; None for anything else (poison, tombstones)."""
    try:
        data = orjson.loads(value or b"")
    except orjson.JSONDecodeError:
        return None
    route = data.get("route") if isinstance(data, dict) else None
    return route if isinstance(route, str) else None


def commands_on(records: list[Any]) -> list[tuple[str, int]]:
    return [(c.action, c.epoch) for c in (unverified_command(r.value) for r in records)]


async def decided_once(settings: Settings, per_route: Mapping[str, int]) -> None:
    """Each route's pairs (``per_route``: route -> how many) judged once each, one trip,
    one rollback command and one alert: what a fault must not repeat or lose."""
    kafka = settings.kafka
    for route, n in per_route.items():
        state = await route_state(configured_redis_url(settings), settings.redis.key_prefix, route)
        assert state.pairs_seen == n, f"{route}: {state.pairs_seen} of {n} judged (twice or lost)"
        assert (state.state, state.trips) == ("open", 1), f"{route}: transition repeated"
        commands = commands_on(
            await records_for(kafka.bootstrap_servers, kafka.topics.control, route)
        )
        assert commands == [("rollback", state.epoch)], f"{route}: {commands}"
        alerts = await records_for(kafka.bootstrap_servers, kafka.topics.alerts, route)
        assert len(alerts) == 1, f"{route}: {len(alerts)} alerts"
