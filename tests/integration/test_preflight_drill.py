"""The switch drill against the embedded stack: real Redis, real control topic, a real
RouteController; the route ends as it started."""

from __future__ import annotations

import pytest

from quantdrift.preflight.config import parse
from quantdrift.preflight.context import Context
from quantdrift.preflight.drill import route_status
from quantdrift.preflight.runner import run

try:
    from guard import isolated_settings, make_topics
except ImportError:  # pragma: no cover
    from tests.integration.guard import isolated_settings, make_topics

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


async def test_switch_drill_rolls_back_restores_and_leaves_the_route(stack, redis_prefix) -> None:  # type: ignore[no-untyped-def]
    settings = isolated_settings(stack, redis_prefix)
    await make_topics(settings)
    route = "shop/int4"
    before = await route_status(settings, route)
    ctx = Context(parse({"route": route}), settings=settings)
    report = await run(ctx, ["switch-drill"])
    item = report["items"][0]
    assert item["status"] == "pass", item["evidence"]
    assert report["verdict"] == "go"
    m = item["measured"]
    assert 0 < m["rollback_s"] < 1.0 and 0 < m["restore_s"] < 1.0
    actions = [s["action"] for s in item["evidence"]["switches"]]
    assert actions == ["rollback", "restore"]
    after = await route_status(settings, route)
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
    await _route(settings, "rollback", route)  # an operator rolled it back
    report = await run(Context(parse({"route": route}), settings=settings), ["switch-drill"])
    item = report["items"][0]
    assert item["status"] == "skipped" and "locked" in item["evidence"]["reason"]
    assert (await route_status(settings, route))["state"] == "open"  # untouched
