"""Redis loses the route's state; the next rollback still reaches the gateway within 1 s.

A gateway that obeyed rollback, canary and restore holds a high epoch. Then the
Redis under the breaker forgets everything: kill -9 of a server with no
persistence and a start on the same port (clients reconnect as if nothing
happened), or FLUSHALL. Drift again: the breaker starts from an empty state,
and its new rollback must still be newer than what the gateway applied (the
epoch is a hybrid logical clock, ``machine.next_epoch``), so the gateway's
RouteController applies it within a second, with no ``stale_epoch`` refusal.
"""

from __future__ import annotations

import signal
import time
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest

from support.guard import make_topics, send_pairs, wait_scored
from support.transitions import (
    FailpointWorker,
    Follower,
    RouteKeys,
    VolatileRedis,
    eventually,
    fast_policy,
    shadow_records,
    transition_settings,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

ROUTE = "lost/int4"
SWITCH_BUDGET_S = 1.0


@pytest.mark.parametrize("loss", ["kill_9_restart_empty", "flushall"])
async def test_rollback_after_redis_loss_reaches_the_gateway_within_a_second(
    fault_stack,  # type: ignore[no-untyped-def]
    tmp_path: Path,
    loss: str,
) -> None:
    started = time.monotonic()
    server = VolatileRedis().start()
    prefix = f"qdfault:{uuid.uuid4().hex}:"
    settings = transition_settings(
        SimpleNamespace(bootstrap=fault_stack.bootstrap, redis_url=server.url),
        prefix,
        fast_policy(tmp_path),
    )
    await make_topics(settings)
    kafka = settings.kafka
    keys = RouteKeys(server.url, prefix, ROUTE)
    worker = FailpointWorker(settings, server.url).start()
    gateway = Follower(settings, server.url, [ROUTE])
    controller = gateway.controller
    sent = 0

    async def send(kind: str, n: int, tag: str, rate: float | None = None) -> dict[bytes, float]:
        nonlocal sent
        records = shadow_records(ROUTE, tag, kind, n, seed=sent)
        sent += n
        return await send_pairs(kafka.bootstrap_servers, kafka.topics.pairs, records, rate)

    async def until(breaker: str, pairs: int, what: str, applied: bool = True) -> None:
        async def reached() -> bool:
            state = await keys.state()
            return (
                state.state == breaker
                and state.pairs_seen == pairs
                and (not applied or controller.epoch(ROUTE) == state.epoch)
            )

        await eventually(reached, 60, what, worker.log_tail)

    try:
        await wait_scored(settings, worker)
        await gateway.start()
        # Rollback, cool-down (canary), restore: the gateway holds the restore's epoch.
        await send("drifted", 3, "before")
        await until("open", 3, "first rollback")
        await until("half_open", 3, "half-open")
        await send("healthy", 2, "before")
        await until("closed", 5, "restore")
        await eventually(keys.drained, 30, "the restore acked", worker.log_tail)
        held = controller.epoch(ROUTE)
        assert controller.target(ROUTE) == "int4"
        assert gateway.actions(ROUTE) == ["rollback", "canary", "restore"]
        stale_before = gateway.verifier.refused.get("stale_epoch", 0)

        # Redis forgets.
        if loss == "kill_9_restart_empty":
            assert server.kill_9() == -signal.SIGKILL
            lost_at = time.monotonic()
            server.start()
        else:
            lost_at = time.monotonic()
            assert await keys.client.flushall() is True
        state = await keys.state()
        assert (state.epoch, state.pairs_seen) == (0, 0), "Redis did not lose the route"
        assert controller.epoch(ROUTE) == held and controller.target(ROUTE) == "int4"

        # Drift again, on an empty state: three healthy pairs (min_pairs), then three
        # failing ones, paced so each has its own publication time.
        await send("healthy", 3, "after")
        await until("closed", 3, "the judge folding into the new Redis", applied=False)
        judging_again = time.monotonic() - lost_at
        published = await send("drifted", 3, "after", rate=20.0)
        command = await controller.wait_for(
            ROUTE, lambda c: c.action == "rollback" and c.epoch > held, timeout=30
        )
        decisive = command.evidence["decisive_pair_id"]
        sent_at = next(t for value, t in published.items() if decisive.encode() in value)
        applied_at = controller.applied_at(ROUTE)
        assert applied_at is not None
        switch_s = applied_at - sent_at

        assert controller.target(ROUTE) == "bf16"
        assert command.epoch > held
        assert gateway.verifier.refused.get("stale_epoch", 0) == stale_before
        assert gateway.epochs(ROUTE)[-1] == command.epoch
        assert gateway.actions(ROUTE) == ["rollback", "canary", "restore", "rollback"]
        assert switch_s <= SWITCH_BUDGET_S, f"gateway switched {switch_s:.3f}s after the pair"
        print(
            f"\n{loss}: restore epoch {held} held by the gateway; after the loss the judge "
            f"folded again {judging_again:.2f}s later; new rollback epoch {command.epoch} "
            f"applied {switch_s * 1000:.0f} ms after the decisive pair's publication "
            f"(via {controller.state(ROUTE).source}); no stale_epoch; "  # type: ignore[union-attr]
            f"{time.monotonic() - started:.1f}s"
        )
    finally:
        await gateway.stop()
        await keys.aclose()
        worker.stop()
        server.close()
