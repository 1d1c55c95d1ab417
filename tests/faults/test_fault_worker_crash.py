"""kill -9 a worker mid-stream, start another with the same settings: none lost, none twice."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest

from quantdrift.demo import synthetic
from quantdrift.demo.workers import WorkerProcess
from quantdrift.schemas.record_keys import pair_record_key
from support import guard
from support.workers import start_worker

pytestmark = [pytest.mark.slow, pytest.mark.timeout(150)]

ROUTES = [f"crash/r{i}" for i in range(3)]


async def test_kill_9_mid_stream_then_restart_loses_nothing_and_repeats_nothing(
    fault_stack,  # type: ignore[no-untyped-def]
) -> None:
    prefix = f"qdfault:{uuid.uuid4().hex}:"
    settings = guard.isolated_settings(fault_stack, prefix, partitions=2)
    await guard.make_topics(settings)
    kafka = settings.kafka
    stream: list[tuple[bytes | None, bytes | None]] = []
    per_route: dict[str, int] = {}
    for i, route in enumerate(ROUTES):
        pairs = guard.on_route(
            guard.shadow_only(synthetic.healthy(route, seed=10 + i), 25), route, "k"
        )
        pairs += guard.on_route(
            guard.shadow_only(synthetic.drifted(route, seed=20 + i), 10), route, "k"
        )
        per_route[route] = len(pairs)
        stream += [(pair_record_key(p), p.dumps()) for p in pairs]
    # Interleave routes so the crash cuts every route's stream, not one after the other.
    stream = [stream[j] for k in range(35) for j in range(k, len(stream), 35)]
    first = start_worker(settings, fault_stack.redis_url)
    second: WorkerProcess | None = None
    try:
        await guard.wait_scored(settings, first)
        producing = asyncio.create_task(
            guard.send_pairs(kafka.bootstrap_servers, kafka.topics.pairs, stream, rate_per_s=30.0)
        )
        # Kill once about a third of the stream is judged: scores in flight, offsets uncommitted.
        deadline = time.monotonic() + 60
        while True:
            seen = [
                (await guard.route_state(fault_stack.redis_url, prefix, r)).pairs_seen
                for r in ROUTES
            ]
            if sum(seen) >= len(stream) // 3:
                break
            assert time.monotonic() < deadline, first.log_tail()
            await asyncio.sleep(0.05)
        first.kill()
        killed_at = sum(seen)
        second = start_worker(settings, fault_stack.redis_url)
        await producing
        for route in ROUTES:
            await guard.until_seen(settings, route, per_route[route], second, timeout=90)
        await asyncio.sleep(1.5)  # any late redelivery would land now
        await guard.decided_once(settings, per_route)
        assert second.alive()
        print(
            f"\nkilled after {killed_at}/{len(stream)} pairs judged; all judged once after restart"
        )
    finally:
        first.kill()
        if second is not None:
            second.stop()
