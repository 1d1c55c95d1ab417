"""``switch-drill``: a real rollback and restore through the control topic, timed.

The drill goes through exactly what on-call runs, ``quantdrift route
rollback|restore|release`` (the console's ``manual_step``: the signed,
epoch-bumping Redis step, then the outbox published to the control topic; the entry
point hands the console in, ``Context.console``), and watches a real
``RouteController`` (the gateway's) apply each command. A switch counts from
the moment the command is issued to the moment the controller applied it.

It leaves the route as it found it: it only runs on a route that is closed
and unlocked (candidate serving, breaker in charge), and ends with restore +
release. A route that is open or locked is skipped with the reason: drilling
it would change what users see or override an operator's lock.
"""

from __future__ import annotations

import getpass
import time
from typing import Any

from quantdrift.config import configured_redis_url
from quantdrift.errors import InputError
from quantdrift.gateway.control.controller import RouteController
from quantdrift.preflight.context import Console, Context
from quantdrift.preflight.report import Item, failed, judged, skipped
from quantdrift.schemas.signing import verifier_from_settings

DRILL = "switch-drill"
TITLE = "Switch drill: rollback and restore applied by a RouteController in < 1 s each"


async def _route(console: Console, settings: Any, action: str, route: str) -> str:
    """One manual step, as ``quantdrift route ACTION --route R`` runs it; its console line."""
    step = await console.manual_step(settings, route, action, who=f"{getpass.getuser()}@cli")
    warning = f"warning: {step.warning}\n" if step.warning else ""
    return f"{warning}{step.summary()}\n"


async def route_status(console: Console, settings: Any, route: str) -> dict[str, Any]:
    """The route's row of ``route status``; {} for a route the breaker has not seen yet
    (closed and unlocked: the candidate serves, as for any new route)."""
    try:
        rows = await console.route_status(settings, route)
    except InputError:  # "unknown route": the CLI refuses it, the drill may start from it
        return {}
    return dict(rows[0]) if rows else {}


async def _switch(
    console: Console, settings: Any, controller: Any, route: str, action: str, timeout: float
) -> dict[str, Any]:
    before = controller.epoch(route)
    t0 = time.monotonic()
    out = await _route(console, settings, action, route)
    issued = time.monotonic()
    cmd = await controller.wait_for(
        route, lambda c: c.epoch > before and c.action == action, timeout
    )
    applied = controller.applied_at(route)
    applied_s = (applied - t0) if applied is not None else time.monotonic() - t0
    return {
        "action": action,
        "epoch": cmd.epoch,
        "apply_s": round(applied_s, 4),
        "cli_s": round(issued - t0, 4),
        "source": getattr(controller.state(route), "source", None),
        "output": out.strip()[:200],
    }


async def switch_drill(ctx: Context) -> Item:
    c = ctx.config.switch_drill
    settings = ctx.settings
    route = ctx.config.route
    console = ctx.console
    if settings is None or not route or console is None:
        return skipped(
            DRILL, TITLE, "needs a route (--route), Kafka/Redis settings and the console"
        )
    before = await route_status(console, settings, route)
    if before.get("state", "closed") != "closed" or before.get("locked"):
        return skipped(
            DRILL,
            TITLE,
            f"route {route} is {before.get('state')}"
            f"{' and locked' if before.get('locked') else ''}: a drill would change "
            "what users see; run it on a closed, unlocked route",
            before=before,
        )
    controller = RouteController(
        settings.kafka,
        configured_redis_url(settings),  # the configured Redis, never a guess
        verifier_from_settings(settings.signing.keys),
        key_prefix=settings.redis.key_prefix,
        routes=[route],
    )
    rows: list[dict[str, Any]] = []
    await controller.start()
    try:
        if not await controller.wait_kafka_ready(c.timeout_s):
            ctx.progress(f"{DRILL}: control topic not followed yet; the Redis key is the backstop")
        for action in ("rollback", "restore"):
            ctx.progress(f"{DRILL}: {action} {route}")
            try:
                rows.append(
                    await _switch(console, settings, controller, route, action, c.timeout_s)
                )
            except TimeoutError:
                rows.append({"action": action, "apply_s": None})
                break
    finally:
        try:
            if (
                rows
                and rows[0].get("action") == "rollback"
                and (len(rows) < 2 or rows[-1].get("apply_s") is None)
            ):
                await _route(console, settings, "restore", route)  # put the candidate back
            await _route(console, settings, "release", route)
            after = await route_status(console, settings, route)
        finally:
            await controller.stop()
    times = [r["apply_s"] for r in rows]
    if len(rows) < 2 or any(t is None for t in times):
        return failed(
            DRILL,
            TITLE,
            {"switches": rows},
            {"max_apply_s": c.max_apply_s},
            why=f"a command was not applied within {c.timeout_s:g}s",
            before=before,
            after=after,
        )
    restored = after.get("state") == before.get("state", "closed") and not after.get("locked")
    ok = all(t < c.max_apply_s for t in times) and restored
    why = f"rollback applied in {times[0] * 1000:.0f} ms, restore in {times[1] * 1000:.0f} ms" + (
        "" if restored else f"; route left {after.get('state')} (was {before.get('state')})"
    )
    return judged(
        DRILL,
        TITLE,
        ok,
        {"rollback_s": times[0], "restore_s": times[1], "route_restored": restored},
        {"max_apply_s": c.max_apply_s},
        why=why,
        switches=rows,
        before=before,
        after=after,
    )
