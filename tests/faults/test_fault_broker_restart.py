"""Broker restarted: the worker and the ShadowPublisher reconnect and carry on.

Tansu's memory storage forgets every record, topic and group offset when it
stops: that loss is the broker's. What is ours: the publisher sends what it
still held once the broker is back, counts anything it had to drop, and the
worker judges every pair that reached the new broker.
"""

from __future__ import annotations

import asyncio
import uuid
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import pytest

from quantdrift.demo import synthetic
from quantdrift.gateway.shadow.publisher import ShadowPublisher
from quantdrift.stack import TansuBroker, free_port
from support import guard
from support.workers import start_worker

pytestmark = [pytest.mark.slow, pytest.mark.timeout(150)]

ROUTE = "broker/restart"
IN_FLIGHT = 4


async def test_broker_restart_worker_and_publisher_carry_on(fault_stack) -> None:  # type: ignore[no-untyped-def]
    port = free_port()
    broker = TansuBroker(port=port).start()
    prefix = f"qdfault:{uuid.uuid4().hex}:"
    # 4 partitions: what Tansu auto-creates if a client asks for a topic before we recreate it.
    settings = guard.isolated_settings(
        SimpleNamespace(bootstrap=broker.bootstrap, redis_url=fault_stack.redis_url),
        prefix,
        partitions=4,
    )
    settings = settings.model_copy(
        update={"kafka": settings.kafka.model_copy(update={"request_timeout_ms": 15_000})}
    )
    await guard.make_topics(settings)
    pairs = guard.on_route(guard.shadow_only(synthetic.healthy(ROUTE, seed=51), 60), ROUTE, "b")
    before, during, after = pairs[:20], pairs[20:40], pairs[40:]
    worker = start_worker(settings, fault_stack.redis_url)
    # A small in-flight window: most pairs offered during the outage stay in the
    # publisher's own queue, the rest are in aiokafka's hands when the broker goes.
    publisher = ShadowPublisher(settings.kafka, 1.0, max_in_flight=IN_FLIGHT)
    try:
        await guard.wait_scored(settings, worker)
        await publisher.start()
        assert await publisher.wait_connected(15)
        for p in before:
            assert publisher.offer(p)
        await guard.until_seen(settings, ROUTE, len(before), worker, timeout=60)
        assert publisher.stats.sent == len(before)

        broker.stop()
        for p in during:  # queued or in flight while the broker is gone
            assert publisher.offer(p)
        await asyncio.sleep(2.0)
        assert publisher.stats.sent == len(before), "sent to a stopped broker?"
        assert publisher.queue_depth >= len(during) - IN_FLIGHT - 1  # one waits for a slot
        assert worker.alive(), worker.log_tail()

        broker = TansuBroker(port=port).start()
        # The topics are back before the publisher (on this loop) can produce to them:
        # Tansu refuses a produce that races CreateTopics (UnknownError), which would
        # drop pairs the publisher still held. So create them without yielding the loop.
        with ThreadPoolExecutor(1) as pool:
            pool.submit(asyncio.run, guard.make_topics(settings)).result()
        for p in after:
            assert publisher.offer(p)
        await publisher.stop(timeout=30.0)
        stats = publisher.stats
        print(f"\npublisher after the restart: {stats}")
        assert stats.offered == len(pairs)
        assert stats.sent + stats.dropped_total == len(pairs), "a pair vanished uncounted"
        # What the queue still held is sent; only what aiokafka held can be lost, counted.
        assert stats.sent >= len(pairs) - IN_FLIGHT - 1
        assert stats.dropped_total == stats.failed <= IN_FLIGHT + 1
        # Every pair the new broker accepted is judged once; the old broker's ones were too.
        state = await guard.until_seen(settings, ROUTE, stats.sent, worker, timeout=60)
        await asyncio.sleep(1.0)
        state = await guard.route_state(fault_stack.redis_url, prefix, ROUTE)
        assert state.pairs_seen == stats.sent
        assert worker.alive()
    finally:
        await publisher.stop(timeout=1.0)
        worker.stop()
        broker.stop()
