"""Redis restarted under load: the judge waits and resumes, the gateway keeps its target."""

from __future__ import annotations

import asyncio
import time
import uuid
from types import SimpleNamespace

import pytest

from quantdrift.demo import synthetic
from quantdrift.gateway.control.controller import RouteController
from quantdrift.schemas.record_keys import pair_record_key
from quantdrift.schemas.signing import verifier_from_settings
from support import guard
from support.faults import PersistentRedis
from support.workers import start_worker

pytestmark = [pytest.mark.slow, pytest.mark.timeout(150)]


def route_pairs(route: str, seed: int) -> list[tuple[bytes | None, bytes | None]]:
    pairs = guard.on_route(guard.shadow_only(synthetic.healthy(route, seed=seed), 25), route, "r")
    pairs += guard.on_route(
        guard.shadow_only(synthetic.drifted(route, seed=seed + 1), 10), route, "r"
    )
    return [(pair_record_key(p), p.dumps()) for p in pairs]


async def test_redis_restart_under_load_loses_no_decision(fault_stack) -> None:  # type: ignore[no-untyped-def]
    server = PersistentRedis().start()
    prefix = f"qdfault:{uuid.uuid4().hex}:"
    settings = guard.isolated_settings(
        SimpleNamespace(bootstrap=fault_stack.bootstrap, redis_url=server.url), prefix
    )
    await guard.make_topics(settings)
    kafka = settings.kafka
    before, during = "redis/before", "redis/during"
    worker = start_worker(settings, server.url)
    controller = RouteController(
        kafka,
        server.url,
        verifier_from_settings(settings.signing.keys),
        key_prefix=prefix,
        routes=[before, during],
        poll_interval_s=0.1,
        redis_options={"socket_connect_timeout": 0.5, "socket_timeout": 0.5},
    )
    try:
        await guard.wait_scored(settings, worker)
        await controller.start()
        # Phase 1: a route rolls back while Redis is up; the gateway applies it.
        first = route_pairs(before, seed=31)
        await guard.send_pairs(kafka.bootstrap_servers, kafka.topics.pairs, first)
        await controller.wait_for(before, lambda c: c.action == "rollback", timeout=60)
        target = controller.target(before)
        assert target is not None

        # Phase 2: another route's stream, Redis stopped while it flows, its decisive
        # pairs produced while Redis is down.
        second = route_pairs(during, seed=41)
        producing = asyncio.create_task(
            guard.send_pairs(kafka.bootstrap_servers, kafka.topics.pairs, second, rate_per_s=8.0)
        )
        await guard.until_seen(settings, during, 8, worker, timeout=30)
        server.stop()
        down_at = time.monotonic()
        errors_before = controller.stats.redis_errors
        while time.monotonic() - down_at < 4.0:
            assert controller.target(before) == target, "gateway dropped its target"
            assert worker.alive(), worker.log_tail()
            await asyncio.sleep(0.2)
        assert controller.stats.redis_errors > errors_before, "controller never saw Redis down"
        server.start()
        up_at = time.monotonic()
        sent_at = await producing
        # The decisive (drifted) pairs were produced while Redis was down.
        drifted_sent = [sent_at[v] for _, v in second[-10:] if v is not None]
        assert all(down_at < t < up_at for t in drifted_sent), "not produced during the outage"
        state = await guard.until_seen(settings, during, len(second), worker, timeout=60)
        command = await controller.wait_for(during, lambda c: c.action == "rollback", timeout=30)
        await asyncio.sleep(1.0)
        for route, n in ((before, len(first)), (during, len(second))):
            state = await guard.route_state(server.url, prefix, route)
            assert state.pairs_seen == n, f"{route}: {state.pairs_seen} of {n}"
            assert (state.state, state.trips) == ("open", 1), route
            commands = guard.commands_on(
                await guard.records_for(kafka.bootstrap_servers, kafka.topics.control, route)
            )
            assert commands == [("rollback", state.epoch)], f"{route}: {commands}"
        assert controller.target(before) == target
        assert controller.target(during) == command.target
        assert "breaker store unavailable" in worker.log_tail(20_000)
    finally:
        await controller.stop()
        worker.stop()
        server.close()
