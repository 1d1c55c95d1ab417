"""The guard loop end to end: real Tansu, real Redis, real worker processes, real MiniLM."""

from __future__ import annotations

import asyncio
import json
import math
import time
import uuid
from collections.abc import Iterator

import pytest
import redis
from aiokafka import AIOKafkaProducer

from quantdrift.config import Settings
from quantdrift.demo import synthetic
from quantdrift.demo.workers import WorkerProcess
from quantdrift.gateway.control.controller import RouteController
from quantdrift.schemas import AlertEvent, DeadLetter, PairEvent
from quantdrift.schemas.keys import route_key
from quantdrift.schemas.pair import EngineInfo
from quantdrift.schemas.signing import unverified_command, verifier_from_settings
from support.guard import (
    isolated_settings,
    make_topics,
    on_route,
    records_for,
    route_state,
    shadow_only,
    until_seen,
)
from support.kafka import consume_n
from support.redis_keys import forget_prefix
from support.workers import start_worker

pytestmark = [pytest.mark.slow]


@pytest.fixture(scope="module")
def guard(stack) -> Iterator[tuple[Settings, WorkerProcess]]:  # type: ignore[no-untyped-def]
    prefix = f"qdtest:{uuid.uuid4().hex}:"
    settings = isolated_settings(stack, prefix)
    asyncio.run(make_topics(settings))
    worker = start_worker(settings, stack.redis_url)
    yield settings, worker
    worker.stop()
    forget_prefix(stack.redis_url, prefix)


async def on_topic(settings: Settings, topic: str, route: str) -> list:  # type: ignore[type-arg]
    """Every record of one of the settings' topics for a route."""
    return await records_for(
        settings.kafka.bootstrap_servers, getattr(settings.kafka.topics, topic), route
    )


async def send(settings: Settings, items: list[tuple[bytes | None, bytes]]) -> dict[bytes, float]:
    """Produce records; returns each value's send time (monotonic)."""
    producer = AIOKafkaProducer(
        bootstrap_servers=settings.kafka.bootstrap_servers,
        acks="all",
        linger_ms=5,
        max_request_size=8 * 1024 * 1024,
    )
    await producer.start()
    sent = {}
    try:
        for key, value in items:
            sent[value] = time.monotonic()
            await producer.send_and_wait(settings.kafka.topics.pairs, key=key, value=value)
    finally:
        await producer.stop()
    return sent


async def test_healthy_stream_gives_no_command_and_no_alert(guard) -> None:  # type: ignore[no-untyped-def]
    settings, worker = guard
    route = "test/healthy"
    pairs = on_route(shadow_only(synthetic.healthy(route, seed=3), 40), route, "h")
    await send(settings, [(route.encode(), p.dumps()) for p in pairs])
    state = await until_seen(settings, route, 40, worker, timeout=180)
    assert state.state == "closed" and state.epoch == 0
    assert await on_topic(settings, "control", route) == []
    assert await on_topic(settings, "alerts", route) == []


async def test_drifted_stream_gives_one_rollback_applied_by_controller(guard) -> None:  # type: ignore[no-untyped-def]
    settings, worker = guard
    route = "test/drifted"
    healthy = on_route(shadow_only(synthetic.healthy(route, seed=5), 25), route, "d")
    drifted = on_route(shadow_only(synthetic.drifted(route, seed=6), 12), route, "d")
    controller = RouteController(
        settings.kafka,
        settings.redis.url,
        verifier_from_settings(settings.signing.keys),
        key_prefix=settings.redis.key_prefix,
        routes=[route],
    )
    await controller.start()
    try:
        assert await controller.wait_kafka_ready(30)
        await send(settings, [(route.encode(), p.dumps()) for p in healthy])
        await until_seen(settings, route, len(healthy), worker)
        sent_at = await send(settings, [(route.encode(), p.dumps()) for p in drifted])
        command = await controller.wait_for(route, lambda c: c.action == "rollback", timeout=60)
        applied = controller.applied_at(route)
        decisive = next(p for p in drifted if p.pair_id == command.evidence["decisive_pair_id"])
        latency_ms = (applied - sent_at[decisive.dumps()]) * 1000
        print(f"\ndecisive pair -> controller switch: {latency_ms:.0f} ms")
        assert controller.target(route) == command.target
        await until_seen(settings, route, len(healthy) + len(drifted), worker)
    finally:
        await controller.stop()
    commands = [unverified_command(r.value) for r in await on_topic(settings, "control", route)]
    assert [c.action for c in commands] == ["rollback"]
    alerts = await on_topic(settings, "alerts", route)
    assert len(alerts) == 1
    assert json.loads(alerts[0].value)["evidence"]["worst_pairs"]


async def test_a_new_candidate_engine_restarts_the_evidence_with_one_alert(guard) -> None:  # type: ignore[no-untyped-def]
    """Pairs name the candidate's engine; when its version changes mid-stream the judge
    restarts the route's evidence and one P2 alert reaches the alerts topic, no command,
    even though every pair of the new engine is delivered twice."""
    settings, worker = guard
    route = "test/engine"
    old = EngineInfo(engine="vllm", version="0.6.3", model="m-w4a16", system_fingerprint="a")
    new = EngineInfo(engine="vllm", version="0.7.0", model="m-w4a16", system_fingerprint="b")

    def served(pair: PairEvent, engine: EngineInfo) -> PairEvent:
        return pair.model_copy(
            update={"candidate": pair.candidate.model_copy(update={"engine": engine})}
        )

    pairs = on_route(shadow_only(synthetic.healthy(route, seed=7), 20), route, "e")
    before = [served(p, old) for p in pairs[:12]]
    after = [served(p, new) for p in pairs[12:]]
    await send(settings, [(route.encode(), p.dumps()) for p in before])
    state = await until_seen(settings, route, 12, worker, timeout=180)
    assert state.candidate_engine == "vllm/0.6.3/m-w4a16"
    await send(settings, [(route.encode(), p.dumps()) for p in after + after])
    assert settings.redis.url is not None
    client = redis.Redis.from_url(settings.redis.url)
    stats = route_key(settings.redis.key_prefix, route, "stats")
    deadline = time.monotonic() + 120
    try:
        while True:  # every pair folded, the redelivered copies refused
            state = await route_state(settings.redis.url, settings.redis.key_prefix, route)
            dups = int(client.hget(stats, "duplicates") or 0)
            if state.candidate_engine == "vllm/0.7.0/m-w4a16" and dups >= len(after):
                break
            assert worker.alive() and time.monotonic() < deadline, worker.log_tail()
            await asyncio.sleep(0.1)
    finally:
        client.close()
    assert state.pairs_seen == len(after) and (state.state, state.epoch) == ("closed", 0)
    alerts = await records_for(
        settings.kafka.bootstrap_servers, settings.kafka.topics.alerts, route, timeout=10.0
    )
    assert len(alerts) == 1, worker.log_tail()
    alert = AlertEvent.parse(alerts[0].value)
    assert (alert.kind, alert.severity) == ("breaker.candidate_changed", "P2")
    assert alert.evidence["current"] == "vllm/0.7.0/m-w4a16"
    assert await on_topic(settings, "control", route) == []


async def test_poisoned_stream_dead_letters_every_bad_message(guard) -> None:  # type: ignore[no-untyped-def]
    settings, worker = guard
    route = "test/poison"
    good = on_route(shadow_only(synthetic.healthy(route, seed=9), 20), route, "p")
    template = json.loads(good[0].dumps())
    nan_entropy = (
        json.dumps({**template, "pair_id": "nan"})
        .replace('"entropy": [', '"entropy": [NaN, ', 1)
        .encode()
    )
    assert b"NaN" in nan_entropy
    huge = json.dumps(
        {
            **template,
            "pair_id": "huge",
            "candidate": {**template["candidate"], "text": "x" * (5 * 1024 * 1024)},
        }
    )
    bad: list[tuple[bytes | None, bytes]] = [
        (route.encode(), b"{not json"),
        (route.encode(), json.dumps({**template, "ts": "yesterday"}).encode()),
        (
            route.encode(),
            json.dumps({k: v for k, v in template.items() if k != "reference"}).encode(),
        ),
        (route.encode(), huge.encode()),
        (route.encode(), nan_entropy),
        (route.encode(), b"\xff\xfe\x00garbage"),
        (
            route.encode(),
            json.dumps(
                {**template, "candidate": {**template["candidate"], "entropy": [math.pi, -1.0]}}
            ).encode(),
        ),
        (b"some/other-route", json.dumps({**template, "pair_id": "wrong-key"}).encode()),
        (route.encode(), b"[]"),
        (route.encode(), json.dumps({**template, "schema_version": 99}).encode()),
    ]
    mixed: list[tuple[bytes | None, bytes]] = []
    for i, pair in enumerate(good):
        mixed.append((route.encode(), pair.dumps()))
        if i < len(bad):
            mixed.append(bad[i])
    await send(settings, mixed)
    await until_seen(settings, route, len(good), worker)
    letters = [
        DeadLetter.parse(r.value)
        for r in await consume_n(
            settings.kafka.bootstrap_servers,
            settings.kafka.topics.dlq,
            len(bad),
            timeout=30,
            strict=False,
        )
    ]
    missing = {v[:80] for _, v in bad} - {letter.original()[:80] for letter in letters}
    assert not missing, f"not dead-lettered: {missing}\n{worker.log_tail()}"
    assert sorted(letter.original() for letter in letters) == sorted(v for _, v in bad)
    assert all(letter.error and letter.offset is not None for letter in letters)
    assert worker.alive()


async def test_two_workers_and_a_redelivered_batch_give_one_command_per_transition(
    stack, redis_prefix, worker_process
) -> None:  # type: ignore[no-untyped-def]
    # Teardown stops the workers (worker_process), then deletes the prefix's keys.
    settings = isolated_settings(stack, redis_prefix, partitions=4)
    await make_topics(settings)
    workers = [worker_process(settings) for _ in range(2)]
    routes = [f"test/pool-{i}" for i in range(3)]
    batch = []
    for route in routes:
        pairs = on_route(shadow_only(synthetic.healthy(route, seed=1), 20), route, route)
        pairs += on_route(shadow_only(synthetic.drifted(route, seed=2), 8), route, route)
        batch += [(route.encode(), p.dumps()) for p in pairs]
    await send(settings, batch)
    await send(settings, batch)  # the same pair ids again: a redelivery
    for route in routes:
        state = await until_seen(settings, route, 28, workers[0], timeout=180)
        assert state.pairs_seen == 28, "a redelivered pair was counted twice"
        assert (state.state, state.trips) == ("open", 1), (route, state.last_decision)
    for route in routes:
        commands = [unverified_command(r.value) for r in await on_topic(settings, "control", route)]
        assert [c.action for c in commands] == ["rollback"], route
    assert all(w.alive() for w in workers)
