"""Mount ``/status``, ``/status.json``, ``/healthz`` and ``/metrics`` on the Faust web server.

Route states are read from Redis by a 1 s timer into a snapshot the views
serve, so a dashboard refreshing in ten tabs costs Redis nothing extra.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import faust

from quantdrift.breaker.state import RouteState
from quantdrift.errors import BreakerStoreError
from quantdrift.status.page import (
    STATUS_HTML,
    History,
    LatencyHistogram,
    StatsLike,
    metrics_text,
    status_json,
)

log = logging.getLogger("quantdrift.status")
PROMETHEUS_TEXT = "text/plain; version=0.0.4"  # aiohttp adds the charset itself


def consumer_lag(app: faust.App) -> dict[str, int]:
    """Highwater minus position per assigned partition, from the consumer's own view."""
    out: dict[str, int] = {}
    try:
        consumer = app.consumer
        for tp in consumer.assignment():
            high = consumer.highwater(tp)
            pos = consumer._last_offset.get(tp)  # type: ignore[attr-defined]
            if high is not None and pos is not None:
                out[f"{tp.topic}/{tp.partition}"] = max(0, int(high) - int(pos) - 1)
    except Exception:  # lag is best effort: never break a scrape
        return {}
    return out


def attach_status(
    app: faust.App,
    stats: StatsLike,
    store: Callable[[], Any],
    clock: Callable[[], float] = time.time,
    refresh_s: float = 1.0,
) -> dict[str, Any]:
    """Register the views and the refresh timer; returns the live snapshot (for tests)."""
    snap: dict[str, Any] = {
        "states": {},
        "history": History(),
        "latency": LatencyHistogram(),
        "store_ok": None,
        "refreshed_at": None,
    }

    async def refresh() -> None:
        try:
            s = store()
            states: dict[str, RouteState] = {}
            for route in await s.routes():
                state, _ = await s.read(route)
                states[route] = state
                snap["history"].observe(route, state)
            snap["states"] = states
            snap["store_ok"] = True
        except BreakerStoreError as exc:
            snap["store_ok"] = False
            log.warning("status: breaker store unavailable (%s)", exc)
        snap["refreshed_at"] = clock()
        snap["latency"].absorb(stats)

    @app.timer(interval=refresh_s)
    async def status_refresh() -> None:
        await refresh()

    @app.page("/status")
    async def status_page(self: Any, request: Any) -> Any:
        return self.html(STATUS_HTML)

    @app.page("/status.json")
    async def status_data(self: Any, request: Any) -> Any:
        body = status_json(snap["states"], stats, snap["history"], clock(), consumer_lag(app))
        return self.json(body, headers={"Cache-Control": "no-store"})

    @app.page("/healthz")
    async def healthz(self: Any, request: Any) -> Any:
        ok = snap["store_ok"] is not False
        body = {"ok": ok, "store_ok": snap["store_ok"], "refreshed_at": snap["refreshed_at"]}
        return self.json(body, status=200 if ok else 503)

    @app.page("/metrics")
    async def metrics(self: Any, request: Any) -> Any:
        snap["latency"].absorb(stats)
        text = metrics_text(stats, snap["states"], snap["latency"], consumer_lag(app))
        return self.text(text, content_type=PROMETHEUS_TEXT)

    return snap
