"""A late ack is fenced: a publisher whose claim expired cannot trim what came after it.

Claim A expires while A is stalled; B claims, sends and acks; a new transition
is queued; then A acks. The ack must return False and leave the new items for
the next publisher. Run on both stores of the ``BreakerStore`` protocol (the
in-memory twin on a clock the test moves), through ``OutboxRelay`` with a send
that blocks, and with a real worker SIGSTOPped between its claim and its ack.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from types import SimpleNamespace

import pytest
import redis.asyncio as aioredis
from aiokafka import AIOKafkaProducer

from quantdrift.breaker.memory_store import MemoryBreakerStore
from quantdrift.breaker.outbox import OutboxItem
from quantdrift.breaker.policy import RoutePolicy
from quantdrift.breaker.protocol import BreakerStore
from quantdrift.breaker.relay import OutboxRelay
from quantdrift.breaker.store import RedisBreakerStore
from quantdrift.schemas.keys import route_key
from quantdrift.schemas.signing import (
    CommandSigner,
    CommandVerifier,
    signer_from_settings,
    verifier_from_settings,
)
from quantdrift.stack import start_redis_server
from support.guard import isolated_settings, make_topics, records_for
from support.workers import start_worker

ROUTE = "fence/int4"
SIGNER = CommandSigner("k1", b"fence-test-key")
VERIFIER = CommandVerifier({"k1": b"fence-test-key"})
POLICY = RoutePolicy()


@dataclass
class StoreUnderTest:
    store: BreakerStore
    holder: Callable[[], Awaitable[str | None]]  # the claim token the store holds, if any
    expire: Callable[[], Awaitable[None]]  # let the current claim run out


@pytest.fixture(params=["memory", "redis"])
async def under_test(request, stack, redis_prefix) -> AsyncIterator[StoreUnderTest]:  # type: ignore[no-untyped-def]
    if request.param == "memory":
        now = [1000.0]
        memory = MemoryBreakerStore(SIGNER, clock=lambda: now[0])

        async def memory_holder() -> str | None:
            owner = memory.owners.get(ROUTE)
            return owner.token if owner is not None and owner.expires_at > now[0] else None

        async def memory_expire() -> None:
            now[0] += 3600.0

        yield StoreUnderTest(memory, memory_holder, memory_expire)
        return
    client = aioredis.Redis.from_url(stack.redis_url)
    owner_key = route_key(redis_prefix, ROUTE, "outbox:owner")

    async def redis_holder() -> str | None:
        raw = await client.get(owner_key)
        return raw.decode() if raw else None

    async def redis_expire() -> None:
        async with asyncio.timeout(5):  # claims here live 200 ms: wait for Redis to expire it
            while await client.exists(owner_key):
                await asyncio.sleep(0.02)

    try:
        yield StoreUnderTest(
            RedisBreakerStore(client, SIGNER, key_prefix=redis_prefix), redis_holder, redis_expire
        )
    finally:
        await client.aclose()


def epochs_of(items: tuple[OutboxItem, ...] | list[OutboxItem]) -> list[int]:
    return [VERIFIER.open(i.value).epoch for i in items if i.topic == "control"]


async def transition(store: BreakerStore, action: str, now: float) -> int:
    result = await store.manual(ROUTE, action, POLICY, now=now)
    assert result.outbox is not None
    return result.outbox.command.epoch


async def test_late_ack_returns_false_and_the_new_items_survive(under_test) -> None:  # type: ignore[no-untyped-def]
    store = under_test.store
    first = await transition(store, "rollback", now=1.0)
    a = await store.claim(ROUTE, "worker-a", ttl_ms=200)
    assert a is not None and epochs_of(a.items) == [first]
    await under_test.expire()  # a stalls past its claim
    b = await store.claim(ROUTE, "worker-b", ttl_ms=10_000)
    assert b is not None and epochs_of(b.items) == [first]
    assert await store.ack(b) is True  # b sent them: trimmed
    second = await transition(store, "restore", now=2.0)
    assert await store.ack(a) is False  # a's late ack: fenced
    await store.release(a)  # nor can a end a claim it lost
    c = await store.claim(ROUTE, "worker-c", ttl_ms=10_000)
    assert c is not None, "the new transition's items were trimmed by a stale ack"
    assert epochs_of(c.items) == [second] and [i.topic for i in c.items] == ["control", "alerts"]
    assert await store.ack(c) is True
    assert await store.claim(ROUTE, "worker-c") is None


async def test_relay_stalled_in_send_past_its_claim_trims_nothing(under_test) -> None:  # type: ignore[no-untyped-def]
    store = under_test.store
    unblock = asyncio.Event()
    sent: dict[str, list[OutboxItem]] = {"a": [], "b": []}

    async def send_a(item: OutboxItem) -> None:
        await unblock.wait()  # the broker hangs for a: its claim runs out meanwhile
        sent["a"].append(item)

    async def send_b(item: OutboxItem) -> None:
        sent["b"].append(item)

    relay_a = OutboxRelay(store, send_a, owner="a", ttl_ms=200)
    relay_b = OutboxRelay(store, send_b, owner="b", ttl_ms=10_000)
    first = await transition(store, "rollback", now=1.0)
    flushing_a = asyncio.create_task(relay_a.flush(ROUTE))
    async with asyncio.timeout(5):
        while not ((await under_test.holder()) or "").startswith("a:"):
            await asyncio.sleep(0.01)
    await under_test.expire()
    assert await relay_b.flush(ROUTE) == 2
    assert epochs_of(sent["b"]) == [first]
    second = await transition(store, "restore", now=2.0)
    unblock.set()
    assert await flushing_a == 0  # a sent (at least once is fine) but acked nothing
    assert relay_a.stats.fenced == 1 and relay_a.stats.acked == 0
    assert epochs_of(sent["a"]) == [first]
    # The restore survived a's late ack: the next flush publishes it.
    assert await relay_b.flush(ROUTE) == 2
    assert epochs_of(sent["b"]) == [first, second]
    assert await under_test.holder() is None


STOP_ATTEMPTS = 8


async def test_worker_sigstopped_mid_publish_cannot_trim_the_next_transition(
    stack,  # type: ignore[no-untyped-def]
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A real worker stopped (SIGSTOP) between its claim and its ack, for longer than the
    claim: B publishes meanwhile, a new transition is queued, SIGCONT: it survives."""
    started = time.monotonic()
    server = start_redis_server()  # our own: keyspace notifications are a server setting
    prefix = f"qdfence:{uuid.uuid4().hex}:"
    settings = isolated_settings(
        SimpleNamespace(bootstrap=stack.bootstrap, redis_url=server.url), prefix
    )
    await make_topics(settings)
    kafka = settings.kafka
    monkeypatch.setenv("QUANTDRIFT_EMBEDDING__TIER", "none")  # no pairs here: no model
    worker = start_worker(settings, server.url)
    client = aioredis.Redis.from_url(server.url)
    pubsub = client.pubsub()
    producer = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap_servers, acks="all")
    verifier = verifier_from_settings(settings.signing.keys)
    signer = signer_from_settings(settings.signing.active_key_id, settings.signing.keys)
    store = RedisBreakerStore(client, signer, key_prefix=prefix)
    owner_key = route_key(prefix, ROUTE, "outbox:owner")
    outbox_key = route_key(prefix, ROUTE, "outbox")
    worker_owner = f"{socket.gethostname()}:{worker.pid}:"
    stopped = False
    try:
        await client.config_set("notify-keyspace-events", "K$")
        await producer.start()
        # The worker is up once its clock has published a first transition.
        await store.manual("fence/warmup", "rollback", POLICY, now=time.time())
        warm_key = route_key(prefix, "fence/warmup", "outbox")
        async with asyncio.timeout(120):
            while await client.llen(warm_key):
                assert worker.alive(), worker.log_tail()
                await asyncio.sleep(0.1)

        await pubsub.subscribe(f"__keyspace@0__:{owner_key}")

        async def send_b(item: OutboxItem) -> None:
            topic = kafka.topics.control if item.topic == "control" else kafka.topics.alerts
            await producer.send_and_wait(topic, item.value, key=ROUTE.encode())

        relay_b = OutboxRelay(store, send_b, owner="b")
        fenced = "claim expired before the ack; not trimmed"
        unread = f"outbox of {ROUTE} not claimed"  # stopped before it read the claim's reply
        attempts, held_by, caught = 0, None, False
        action = "rollback"
        while not caught:
            attempts += 1
            assert attempts <= STOP_ATTEMPTS, "never caught the worker between claim and ack"
            # Drain old events, queue a transition, stop the worker when it claims it.
            while await pubsub.get_message(ignore_subscribe_messages=True, timeout=0.01):
                pass
            first = (await store.manual(ROUTE, action, POLICY, now=time.time())).state
            assert first is not None
            action = "restore" if action == "rollback" else "rollback"
            async with asyncio.timeout(10):
                while True:
                    message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1)
                    if message and message["data"] == b"set":
                        break
            os.kill(worker.pid or 0, signal.SIGSTOP)
            stopped, stopped_at = True, time.monotonic()
            token = (await client.get(owner_key) or b"").decode()
            if not (token.startswith(worker_owner) and await client.llen(outbox_key)):
                os.kill(worker.pid or 0, signal.SIGCONT)  # missed the window: try again
                stopped = False
                async with asyncio.timeout(10):
                    while await client.llen(outbox_key) or await client.exists(owner_key):
                        await asyncio.sleep(0.05)
                continue
            held_by, stalled_epoch = token, first.epoch
            log_before = worker.log_tail(1_000_000)

            # Stopped for longer than the claim (10 s): it expires under the stopped worker.
            async with asyncio.timeout(15):
                while await client.exists(owner_key):
                    await asyncio.sleep(0.05)
            assert await relay_b.flush(ROUTE) == 2
            after = await store.manual(ROUTE, action, POLICY, now=time.time())
            assert after.outbox is not None
            new_epoch = after.outbox.command.epoch
            action = "restore" if action == "rollback" else "rollback"
            assert await client.llen(outbox_key) == 2
            os.kill(worker.pid or 0, signal.SIGCONT)
            stopped = False
            stopped_for = time.monotonic() - stopped_at

            # The resumed worker's ack is fenced, and it publishes the new transition itself.
            # A stop that landed after Redis ran the claim but before the worker read its
            # reply shows as a timed-out claim instead: nothing was held by the worker, so
            # the fence was not exercised; the outbox still drains, and the attempt repeats.
            deadline = time.monotonic() + 30
            while True:
                tail = worker.log_tail(1_000_000)[len(log_before) :]
                done = not await client.llen(outbox_key)
                if done and fenced in tail:
                    caught = True
                    break
                if done and unread in tail:
                    break
                assert worker.alive(), worker.log_tail()
                assert time.monotonic() < deadline, (
                    f"after SIGCONT: fenced={fenced in tail}, unread={unread in tail}, "
                    f"outbox={await client.llen(outbox_key)}\n{worker.log_tail()}"
                )
                await asyncio.sleep(0.05)
        records = await records_for(kafka.bootstrap_servers, kafka.topics.control, ROUTE)
        on_topic = [verifier.open(r.value).epoch for r in records]
        assert stalled_epoch in on_topic
        assert new_epoch in on_topic, f"the transition queued after the stall was lost: {on_topic}"
        print(
            f"\nworker {worker.pid} stopped holding {held_by} (attempt {attempts}); claim expired; "
            f"B published epoch {stalled_epoch}; SIGCONT after {stopped_for:.1f}s stopped; "
            f"late ack fenced; epoch {new_epoch} published; {time.monotonic() - started:.1f}s"
        )
    finally:
        if stopped:
            os.kill(worker.pid or 0, signal.SIGCONT)
        worker.stop()
        await pubsub.aclose()
        await producer.stop()
        await client.aclose()
        server.stop()
