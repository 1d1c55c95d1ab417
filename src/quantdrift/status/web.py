"""Mount ``/status``, ``/status.json``, ``/healthz`` and ``/metrics`` on the Faust web server.

Route states are read from Redis by a 1 s timer into a snapshot the views
serve, so a dashboard refreshing in ten tabs costs Redis nothing extra. The
consumer's lag and stalls come from the stall watch (``status/watchdog.py``),
on its own timer: ``/healthz`` fails while a partition the worker holds is stalled.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import faust

from quantdrift.breaker.policy import Policy
from quantdrift.breaker.readiness import Readiness, readiness
from quantdrift.breaker.state import RouteState
from quantdrift.errors import BreakerStoreError
from quantdrift.status.page import (
    STATUS_HTML,
    History,
    LatencyHistogram,
    StatsLike,
    TierCounts,
    metrics_text,
    spend_view,
    status_json,
)
from quantdrift.status.watchdog import StallWatch, consumer_state, look

log = logging.getLogger("quantdrift.status")
PROMETHEUS_TEXT = "text/plain; version=0.0.4"  # aiohttp adds the charset itself


def attach_status(
    app: faust.App,
    stats: StatsLike,
    store: Callable[[], Any],
    clock: Callable[[], float] = time.time,
    refresh_s: float = 1.0,
    stall_after_s: float = 60.0,
    tiers: Callable[[], TierCounts | None] = lambda: None,
    policy: Policy | None = None,
) -> dict[str, Any]:
    """Register the views and the timers; returns the live snapshot (for tests).

    ``tiers`` gives the tiered scorer's agreement record once the scorer is
    loaded (None before, and for the other scorers); /metrics exports it. With the
    worker's ``policy``, each route's readiness is read with its floors and shown
    (armed, or what its tests miss) on the page, in /status.json and in /metrics.
    """
    watch = StallWatch(stall_after_s=stall_after_s)
    snap: dict[str, Any] = {
        "states": {},
        "readiness": {},
        "spend": {},
        "history": History(),
        "latency": LatencyHistogram(),
        "store_ok": None,
        "refreshed_at": None,
    }

    async def refresh() -> None:
        try:
            s = store()
            states: dict[str, RouteState] = {}
            ready: dict[str, Readiness] = {}
            spend: dict[str, dict[str, Any] | None] = {}
            for route in await s.routes():
                state, _ = await s.read(route)
                states[route] = state
                # The live gateways' spend and shares (gateway/control/spend_report.py).
                spend[route] = spend_view(await s.spend_reports(route))
                snap["history"].observe(route, state)
                if policy is not None:
                    floors = await s.read_floors(route)
                    ready[route] = readiness(policy.for_route(route), state, floors)
            snap["states"] = states
            snap["readiness"] = ready
            snap["spend"] = spend
            snap["store_ok"] = True
        except BreakerStoreError as exc:
            snap["store_ok"] = False
            log.warning("status: breaker store unavailable (%s)", exc)
        snap["refreshed_at"] = clock()
        snap["latency"].absorb(stats)

    @app.timer(interval=refresh_s)
    async def status_refresh() -> None:
        await refresh()

    @app.timer(interval=min(5.0, stall_after_s / 4))
    async def stall_watch() -> None:
        try:
            unfinished, ends = await look(app)
        except Exception as exc:  # a rebalance, the broker away: the next look retries
            log.warning("stall watch: could not read offsets (%r)", exc)
            return
        was_stalled = bool(watch.stalled)
        newly = watch.observe(time.monotonic(), unfinished, ends)
        if newly:
            try:
                evidence: Any = consumer_state(app, set(newly))
            except Exception as exc:  # evidence, best effort: the stall is logged anyway
                evidence = {"error": repr(exc)}
            log.error(
                "stalled: %s behind with nothing finished for %.0f s or more; /healthz now "
                "fails. Consumer state: %s",
                ", ".join(f"{tp} {watch.behind[tp]} records" for tp in newly),
                stall_after_s,
                evidence,
            )
        elif was_stalled and not watch.stalled:
            log.warning("stall over: every held partition is moving again")

    @app.page("/status")
    async def status_page(self: Any, request: Any) -> Any:
        return self.html(STATUS_HTML)

    @app.page("/status.json")
    async def status_data(self: Any, request: Any) -> Any:
        body = status_json(
            snap["states"],
            stats,
            snap["history"],
            clock(),
            watch.behind,
            snap["readiness"],
            snap["spend"],
        )
        body["stalled"] = watch.report()
        return self.json(body, headers={"Cache-Control": "no-store"})

    @app.page("/healthz")
    async def healthz(self: Any, request: Any) -> Any:
        ok = snap["store_ok"] is not False and not watch.stalled
        body = {
            "ok": ok,
            "store_ok": snap["store_ok"],
            "refreshed_at": snap["refreshed_at"],
            "stalled": watch.report(),
        }
        return self.json(body, status=200 if ok else 503)

    @app.page("/metrics")
    async def metrics(self: Any, request: Any) -> Any:
        snap["latency"].absorb(stats)
        text = metrics_text(
            stats, snap["states"], snap["latency"], watch.behind, tiers(), snap["readiness"]
        )
        return self.text(text, content_type=PROMETHEUS_TEXT)

    return snap
