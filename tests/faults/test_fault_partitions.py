"""Partitions across real network boundaries: each part on its own host, links cut silently.

The short schedule of the multi-host rig (``netrig.py``, ``rig_stack.py``): Redis,
the broker, the worker and the gateway each in a network namespace of their own,
the openai SDK and the scripted upstream on the observer host (this process). A
partition is an nftables ``drop`` inside one side's namespace, and every case
proves it met traffic (the rule's packet counter moved) in the window that matters.

* gateway <-> Redis: the gateway follows the control topic, keeps the last verified
  state; cut from the broker too, it keeps that state ``control_stale_s`` then fails
  closed to the reference; no user sees a 5xx; healed, it serves the candidate again.
* gateway <-> broker: users are served; the pairs the publisher cannot send are
  dropped with a reason, and every mirrored request is a pair on the topic (once)
  or a counted drop.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import orjson
import pytest

from support.gateway_process import GatewayProcess
from support.kafka import consume_n
from support.netrig import Rig, sweep
from support.rig_stack import Load, RigStack, wait

pytestmark = [pytest.mark.timeout(120)]

STALE_S = 3.0
RECOVER_S = 2.0  # the target: the newest state within 2 s of the link coming back


@pytest.fixture
def rig() -> Iterator[Rig]:
    sweep()
    with Rig(["redis", "broker", "worker", "gateway"]) as made:
        yield made


@pytest.fixture
def parts(rig: Rig) -> Iterator[RigStack]:
    stack = RigStack(rig)
    try:
        yield stack
    finally:
        stack.close()


def served(load: Load, since: float) -> set[str]:
    return {p for _, status, p in load.since(since) if status == 200}


def test_gateway_cut_from_redis_then_from_both_control_sources(parts: RigStack) -> None:
    parts.start_redis().start_broker().start_upstream()
    gw = parts.start_gateway(control_stale_s=STALE_S)
    wait(lambda: gw.health()["control_known"] and gw.health()["control_ready"], 30, "control")
    load = Load(gw.url).start()
    try:
        t0 = time.monotonic()
        wait(lambda: len(load.since(t0)) >= 5, 20, "traffic")
        assert served(load, t0) == {"int4"}, load.since(t0)

        # gateway <-> Redis: the topic still answers, so the state stays verified.
        redis_cut = parts.rig.partition("gateway", "redis")
        t1 = time.monotonic()
        time.sleep(STALE_S * 2)
        assert redis_cut.packets() > 0, "the gateway never tried Redis while cut off"
        assert not gw.health()["control_stale"]
        assert served(load, t1) == {"int4"}, "a Redis partition alone moved the route"

        # ... and from the broker: neither source answers. The last verified state
        # holds for control_stale_s, then every route serves its reference.
        broker_cut = parts.rig.partition("gateway", "broker")
        t2 = time.monotonic()
        took = wait(lambda: gw.health()["control_stale"], STALE_S + 10, "failing closed")
        assert broker_cut.packets() > 0, "the gateway never tried the broker while cut off"
        assert STALE_S - 1.0 <= took <= STALE_S + 3.0, f"failed closed after {took:.1f}s"
        t3 = time.monotonic()
        wait(lambda: len(served(load, t3)) > 0 and len(load.since(t3)) >= 5, 20, "traffic")
        assert served(load, t3) == {"bf16"}, "a stale gateway served the candidate"
        assert served(load, t2) <= {"int4", "bf16"}

        # Healed: the gateway verifies its state again and serves the candidate.
        redis_cut.heal()
        broker_cut.heal()
        back = wait(lambda: not gw.health()["control_stale"], 30, "the state verified again")
        t5 = time.monotonic()
        wait(lambda: "int4" in served(load, t5), 10, "the candidate served again")
    finally:
        load.stop()
    statuses = {status for _, status, _ in load.seen}
    assert statuses == {200}, f"users saw {statuses} during control-plane faults"
    print(
        f"\nRedis cut {redis_cut.table}; both cut: fail closed after {took:.2f}s "
        f"(control_stale_s {STALE_S}); healed: verified again after {back:.2f}s; "
        f"{len(load.seen)} requests, all 200"
    )
    assert back <= RECOVER_S, f"verified again {back:.2f}s after the links came back"


def pairs_accounted(gw: GatewayProcess) -> dict[str, float]:
    """The gateway's own pair counters: sampled, offered, sent, dropped by stage."""
    m = gw.metric
    return {
        "sampled": m("quantdrift_gateway_shadow_sampled_total"),
        "offered": m("quantdrift_gateway_pairs_offered_total"),
        "sent": m("quantdrift_gateway_pairs_sent_total"),
        "dropped_queue": m("quantdrift_gateway_shadow_dropped_total", stage="queue"),
        "dropped_publish": m("quantdrift_gateway_shadow_dropped_total", stage="publish"),
        "errors": m("quantdrift_gateway_shadow_errors_total"),
        "depth": m("quantdrift_gateway_pairs_queue_depth"),
    }


def test_gateway_cut_from_the_broker_serves_users_and_counts_the_pairs_it_drops(
    parts: RigStack,
) -> None:
    parts.start_redis().start_broker().start_upstream()
    # Every request mirrored; a small publish queue, so the partition overflows it soon.
    gw = parts.start_gateway(shadow_sample_rate=1.0, shadow_queue=8)
    wait(lambda: gw.health()["kafka_connected"], 30, "the publisher connected")
    load = Load(gw.url).start()
    try:
        wait(lambda: pairs_accounted(gw)["sent"] >= 5, 30, "pairs reaching the broker")
        cut = parts.rig.partition("gateway", "broker")
        before = pairs_accounted(gw)
        wait(
            lambda: pairs_accounted(gw)["dropped_publish"] > before["dropped_publish"],
            30,
            "pairs dropped while the broker is unreachable",
        )
        assert cut.packets() > 0, "the gateway never tried the broker while cut off"
        during = pairs_accounted(gw)
        cut.heal()
        healed = time.monotonic()
        wait(lambda: pairs_accounted(gw)["sent"] > during["sent"], 60, "pairs sent again")
        recovered = time.monotonic() - healed
    finally:
        load.stop()
    wait(
        lambda: gw.health()["shadow_queue"] == 0 and gw.health()["shadow_in_flight"] == 0,
        30,
        "idle",
    )
    wait(lambda: pairs_accounted(gw)["depth"] == 0, 60, "the publish queue drained")
    end = pairs_accounted(gw)
    statuses = {status for _, status, _ in load.seen}
    assert statuses == {200}, f"users saw {statuses} while the broker was cut off"
    # Every mirrored request is a pair sent, or a drop counted with its reason.
    assert end["sampled"] == end["offered"] + end["dropped_queue"] + end["errors"], end
    assert end["offered"] == end["sent"] + end["dropped_publish"], end
    # And what was sent is on the topic, each pair once.
    assert parts.settings is not None
    records = asyncio.run(
        consume_n(parts.bootstrap, parts.settings.kafka.topics.pairs, int(end["sent"]), timeout=30)
    )
    ids = [orjson.loads(r.value)["pair_id"] for r in records]
    assert len(set(ids)) == len(ids) == end["sent"], (len(set(ids)), len(ids), end)
    print(
        f"\nbroker cut {during['dropped_publish'] - before['dropped_publish']:.0f} pairs dropped "
        f"(counted); healed: pairs sent again after {recovered:.2f}s; {len(load.seen)} "
        f"requests, all 200; {end}"
    )
