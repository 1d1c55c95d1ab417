"""The switch drill against the embedded stack: real Redis, real control topic, a real
RouteController; the route ends as it started."""

from __future__ import annotations

import pytest

from quantdrift.preflight.config import parse
from quantdrift.preflight.drill import route_status
from quantdrift.preflight.runner import run
from quantdrift.services import console
from quantdrift.services.preflight import preflight_context
from support.guard import isolated_settings, make_topics
from support.workers import start_worker

pytestmark = [pytest.mark.timeout(120)]


async def test_switch_drill_rolls_back_restores_and_leaves_the_route(stack, redis_prefix) -> None:  # type: ignore[no-untyped-def]
    settings = isolated_settings(stack, redis_prefix)
    await make_topics(settings)
    route = "shop/int4"
    before = await route_status(console, settings, route)
    ctx = preflight_context(parse({"route": route}), settings=settings)
    report = await run(ctx, ["switch-drill"])
    item = report["items"][0]
    assert item["status"] == "pass", item["evidence"]
    assert report["verdict"] == "go"
    m = item["measured"]
    assert 0 < m["rollback_s"] < 1.0 and 0 < m["restore_s"] < 1.0
    actions = [s["action"] for s in item["evidence"]["switches"]]
    assert actions == ["rollback", "restore"]
    after = await route_status(console, settings, route)
    assert (after["state"], after["locked"]) == (before.get("state", "closed"), False)
    assert after["epoch"] > before.get("epoch", 0)  # it really went through the breaker
    print(
        f"\nswitch drill: rollback {m['rollback_s'] * 1000:.0f} ms, "
        f"restore {m['restore_s'] * 1000:.0f} ms"
    )


async def test_drill_refuses_an_open_route(stack, redis_prefix) -> None:  # type: ignore[no-untyped-def]
    from quantdrift.preflight.drill import _route

    settings = isolated_settings(stack, redis_prefix)
    await make_topics(settings)
    route = "shop/int4"
    await _route(console, settings, "rollback", route)  # an operator rolled it back
    report = await run(
        preflight_context(parse({"route": route}), settings=settings), ["switch-drill"]
    )
    item = report["items"][0]
    assert item["status"] == "skipped" and "locked" in item["evidence"]["reason"]
    assert (await route_status(console, settings, route))["state"] == "open"  # untouched


async def test_shadow_link_round_trip_through_a_real_worker(stack, redis_prefix, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A pair published on the probe route comes back as a ScoreEvent from `quantdrift worker`."""

    settings = isolated_settings(stack, redis_prefix)
    await make_topics(settings)
    gw = tmp_path / "gateway.yaml"
    gw.write_text(
        "precisions: {int4: ['http://127.0.0.1:9'], bf16: ['http://127.0.0.1:9']}\n"
        "routes: {lab/int8: {candidate: int4, reference: bf16, shadow_sample_rate: 0.05}}\n"
    )
    worker = start_worker(settings, stack.redis_url)
    try:
        cfg = parse(
            {
                "gateway_config": str(gw),
                "route": "lab/int8",
                "shadow_link": {"max_pairs": 40, "roundtrip_timeout_s": 90},
            }
        )
        report = await run(preflight_context(cfg, settings=settings), ["shadow-link"])
    finally:
        worker.stop()
    item = report["items"][0]
    m = item["measured"]
    print(f"\nshadow-link: {m}")
    assert m["shadow_share"] == 0.05 and m["pairs_timed"] == 40
    assert m["roundtrip_s"] is not None, (item["evidence"]["why"], worker.log_tail())
    assert item["evidence"]["pairs"] == "40 recorded pairs of lab/int8"
    # Pass or fail rests on the measured scoring cost alone (machine-dependent):
    assert item["status"] == ("pass" if m["scoring_p99_ms"] < 10 else "fail")


async def test_shadow_link_is_ready_only_when_the_route_is_armed(
    stack, redis_prefix, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    """The default rule's divergence tests need the route's floor: until it is there the
    shadow link names what is missing; once calibrated, that problem is gone."""
    from quantdrift.breaker.store import RedisBreakerStore
    from quantdrift.services.console import open_store

    settings = isolated_settings(stack, redis_prefix).model_copy(update={"policy_file": None})
    gw = tmp_path / "gateway.yaml"
    gw.write_text(
        "precisions: {int4: ['http://127.0.0.1:9'], bf16: ['http://127.0.0.1:9']}\n"
        "routes: {lab/int4: {candidate: int4, reference: bf16, shadow_sample_rate: 0.05}}\n"
        "pools: {bf16: {logprobs: false}}\n"
    )
    cfg = parse(
        {
            "gateway_config": str(gw),
            "route": "lab/int4",
            "shadow_link": {"max_pairs": 5, "roundtrip": False},
        }
    )
    report = await run(preflight_context(cfg, settings=settings), ["shadow-link"])
    item = report["items"][0]
    assert item["measured"]["route_armed"] is False
    assert item["measured"]["tests_missing"] == [
        "tolerance:dissimilarity: no floor: 0 of 10 sampled noise pairs",
        "tolerance:lexical: no floor: 0 of 10 sampled noise pairs",
    ]
    assert "the route is not armed: tolerance:dissimilarity: no floor" in item["evidence"]["why"]

    store: RedisBreakerStore
    async with open_store(settings) as store:  # what `quantdrift calibrate` writes
        rows = [{"cosine": 0.9 + i / 200, "rougeL": 0.5 + i / 50} for i in range(12)]
        await store.seed_floor("lab/int4", "sampled", rows)
    report = await run(preflight_context(cfg, settings=settings), ["shadow-link"])
    item = report["items"][0]
    assert (item["measured"]["route_armed"], item["measured"]["tests_missing"]) == (True, [])
    assert "not armed" not in item["evidence"]["why"]
