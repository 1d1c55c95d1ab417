"""Users never wait on the shadow side, even when it is saturated: proven without a clock.

Eight concurrent users send a fixed number of requests each while shadowing is
at 100 % and the reference holds **every** answer until the test releases it
(the scripted ``gate`` mode). Every user must get a 200 from the candidate
while the reference has answered nothing: no pair is published before the
gate opens, every shadow worker is blocked on the reference, and the queue
has dropped the oldest jobs. A user request that waited on the shadow side
would hang at the gate and fail the test's timeout, whatever the machine's
speed. The accounting is exact: each mirrored request is in flight, queued
or dropped, and after the release the ones not dropped become pairs.

How much the shadow side costs users' p99 under load is a speed figure, not
a test: ``bench/shadow_isolation.py`` measures it (shadowing on against off,
in one run) and ``make bench`` writes it to BENCHMARKS.md.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from quantdrift.gateway.http.service import Gateway
from support.gateway_upstream import (
    Scripted,
    chat_body,
    make_config,
    serving,
)

pytestmark = [pytest.mark.timeout(120)]

USERS = 8
REQUESTS_PER_USER = 10
CONCURRENCY = 4  # shadow workers (and shadow connections): all of them end up at the gate
QUEUE = 8


class Sink:
    """Stands in for the Kafka publisher (the broker is not this test's seam): counts pairs."""

    def __init__(self) -> None:
        self.pairs = 0
        self.connected, self.queue_depth = True, 0
        self.stats = type("S", (), {"offered": 0, "sent": 0, "dropped": {}})()

    async def start(self) -> None: ...

    async def stop(self, timeout: float = 5.0) -> None: ...

    def offer(self, pair: Any) -> bool:
        self.pairs += 1
        return True


async def until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.01)


async def users(client: httpx.AsyncClient) -> int:
    """USERS closed-loop users, REQUESTS_PER_USER each; every answer a 200 from the candidate."""
    answered = 0

    async def user(i: int) -> None:
        nonlocal answered
        for n in range(REQUESTS_PER_USER):
            resp = await client.post("/v1/chat/completions", json=chat_body(f"u{i} r{n}"))
            assert resp.status_code == 200, resp.text
            assert resp.headers["x-quantdrift-precision"] == "int4"
            answered += 1

    await asyncio.gather(*(user(i) for i in range(USERS)))
    return answered


async def test_users_never_wait_on_a_saturated_shadow(scripted: Scripted) -> None:
    config = make_config(
        scripted,
        {"int4": "good", "int8": "good", "bf16": "gate"},
        shadow_sample_rate=1.0,
        shadow_queue=QUEUE,
        shadow_concurrency=CONCURRENCY,
        shadow_max_connections=CONCURRENCY,
        timeouts={"connect_s": 5, "read_s": 60, "total_s": 60, "shadow_total_s": 60},
    )
    sink = Sink()
    gw = Gateway(config, publisher=sink)  # type: ignore[arg-type]
    scripted.gate.clear()
    try:
        async with serving(gw) as client:
            # Every user is answered while the reference holds every shadow call.
            answered = await asyncio.wait_for(users(client), 60)
            total = USERS * REQUESTS_PER_USER
            assert answered == total
            await until(lambda: gw.shadow.in_flight == CONCURRENCY)
            assert sink.pairs == 0, "a shadow answer arrived: the gate did not hold"
            # Each mirrored request is in flight, queued, or dropped (the oldest first).
            dropped = gw.shadow.dropped.get("queue_full", 0)
            assert gw.shadow.depth == QUEUE
            assert dropped == total - CONCURRENCY - QUEUE
            metrics = (await client.get("/metrics")).text
            line = 'quantdrift_gateway_shadow_dropped_total{reason="queue_full",stage="queue"}'
            assert f"{line} {float(dropped)}" in metrics
            # Released, the shadow side drains: the jobs not dropped become pairs.
            scripted.gate.set()
            await gw.wait_shadows(30)
            assert sink.pairs == CONCURRENCY + QUEUE
    finally:
        scripted.gate.set()
