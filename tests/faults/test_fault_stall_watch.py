"""A worker that stops finishing records says so on /healthz, and is well again once it moves.

Real worker process, broker and Redis. The stall is made on purpose: the
``sleep:score:<pair_id>`` failpoint blocks the scoring thread for ``SLEEP_S``
seconds on each of three pairs, 18 s in a row, while the pairs behind them wait on
the same partition. The process stays up, its group stays stable and its event loop
idles: the failure a crash restart never sees. With ``worker.stall_after_s`` at 4 s:

* ``/healthz`` answers 503 and names the pairs partition while the thread sleeps,
  and the route has not yet judged every pair then (the fault is in the window);
* the worker logs the stall once, with the consumer's state as evidence;
* once the pairs are scored, every pair is judged once and ``/healthz`` answers 200.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import httpx
import pytest

from quantdrift.demo import synthetic
from quantdrift.failpoints import SLEEP_S
from quantdrift.stack import free_port
from support import guard
from support.transitions import FailpointWorker

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

STALL_AFTER_S = 4.0
SLOW_PAIRS = 3


async def health(port: int) -> tuple[int, dict[str, Any]]:
    async with httpx.AsyncClient(timeout=2.0) as client:
        resp = await client.get(f"http://127.0.0.1:{port}/healthz")
        return resp.status_code, resp.json()


async def until_health(
    port: int, status: int, timeout: float, worker: FailpointWorker
) -> dict[str, Any]:
    """Poll /healthz until it answers ``status``; its body then."""
    deadline = time.monotonic() + timeout
    seen: list[int] = []
    while time.monotonic() < deadline:
        code, body = await health(port)
        seen.append(code)
        if code == status:
            return body
        assert worker.alive(), worker.log_tail()
        await asyncio.sleep(0.2)
    raise AssertionError(
        f"/healthz never answered {status} in {timeout} s (answers: {sorted(set(seen))})\n"
        + worker.log_tail()
    )


async def test_a_stalled_partition_fails_healthz_until_it_moves(fault_stack) -> None:  # type: ignore[no-untyped-def]
    base = guard.isolated_settings(fault_stack, f"qdfault:{uuid.uuid4().hex}:", partitions=1)
    port = free_port()
    settings = base.model_copy(
        update={
            "worker": base.worker.model_copy(
                update={"web_port": port, "stall_after_s": STALL_AFTER_S}
            )
        }
    )
    await guard.make_topics(settings)
    kafka = settings.kafka
    route = "stall/int4"
    pairs = guard.on_route(guard.shadow_only(synthetic.healthy(route, seed=81), 12), route, "stall")
    slow = pairs[:SLOW_PAIRS]
    worker = FailpointWorker(
        settings,
        fault_stack.redis_url,
        failpoints=tuple(f"sleep:score:{p.pair_id}" for p in slow),
    ).start()
    try:
        await guard.wait_scored(settings, worker)
        code, body = await health(port)
        assert code == 200 and body["stalled"] == {}, body
        started = time.monotonic()
        await guard.send_pairs(
            kafka.bootstrap_servers,
            kafka.topics.pairs,
            [(route.encode(), p.dumps()) for p in pairs],
        )
        body = await until_health(port, 503, SLOW_PAIRS * SLEEP_S, worker)
        flagged_after = time.monotonic() - started
        state = await guard.route_state(fault_stack.redis_url, settings.redis.key_prefix, route)
        # The fault is in the window: the thread sleeps and the route waits for its pairs.
        assert state.pairs_seen < len(pairs), state
        # Which slow pair sleeps first is the lanes' choice (shortest pairs are staged
        # first): one of them must be asleep.
        err = worker.stderr()
        assert any(f"sleep:score:{p.pair_id}: sleeping" in err for p in slow), err
        assert list(body["stalled"]) == [f"{kafka.topics.pairs}/0"], body
        assert body["stalled"][f"{kafka.topics.pairs}/0"] >= STALL_AFTER_S
        assert flagged_after >= STALL_AFTER_S, f"flagged {flagged_after:.1f} s after the send"
        # The stall's evidence, logged once: what Faust and aiokafka hold for the partition.
        log = worker.log_tail(200_000)
        assert log.count("stalled: ") == 1, log
        assert "'committed_offset'" in log and "'aiokafka_paused': False" in log, log

        await guard.until_seen(settings, route, len(pairs), worker, timeout=60)
        body = await until_health(port, 200, 15, worker)
        assert body["stalled"] == {}
        assert "stall over" in worker.log_tail(200_000)
        state = await guard.route_state(fault_stack.redis_url, settings.redis.key_prefix, route)
        assert state.pairs_seen == len(pairs), state
    finally:
        worker.stop()
