"""The status page's content: pure functions from route states and worker counters.

``/status`` is a static HTML shell whose script polls ``/status.json`` and
redraws the route table and each route's similarity sparkline (inline SVG);
``/metrics`` is Prometheus text. No I/O here: ``web.py`` mounts the views.
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from quantdrift.breaker.state import RouteState

STATE_VALUE = {"closed": 0, "half_open": 1, "open": 2}
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class StatsLike(Protocol):
    pairs_scored: int
    dead_letters: int
    scores_judged: int
    duplicates: int
    transitions: int
    store_errors: int
    batches: int
    scoring_seconds: list[float]


@dataclass
class LatencyHistogram:
    """A cumulative Prometheus histogram fed from WorkerStats' rolling list.

    WorkerStats keeps the last 2048 per-pair batch latencies and counts
    ``batches``; the entries added since the last ``absorb`` are the last
    ``batches - seen`` of the list, so counts stay monotonic across scrapes.
    """

    buckets: tuple[float, ...] = LATENCY_BUCKETS
    counts: list[int] = field(default_factory=lambda: [0] * (len(LATENCY_BUCKETS) + 1))
    total: float = 0.0
    n: int = 0
    seen_batches: int = 0

    def absorb(self, stats: StatsLike) -> None:
        new = stats.batches - self.seen_batches
        if new <= 0:
            return
        values = stats.scoring_seconds[-new:] if new <= len(stats.scoring_seconds) else []
        for v in values:
            self.counts[bisect.bisect_left(self.buckets, v)] += 1
            self.total += v
            self.n += 1
        self.seen_batches = stats.batches


@dataclass
class History:
    """Per route, the last ``size`` (pairs_seen, similarity) points for the sparkline."""

    size: int = 120
    points: dict[str, deque[tuple[int, float]]] = field(default_factory=dict)

    def observe(self, route: str, state: RouteState) -> None:
        if state.last_similarity is None:
            return
        ring = self.points.setdefault(route, deque(maxlen=self.size))
        if ring and ring[-1][0] == state.pairs_seen:
            return
        ring.append((state.pairs_seen, round(float(state.last_similarity), 4)))


def route_view(route: str, state: RouteState) -> dict[str, Any]:
    return {
        "route": route,
        "state": state.state,
        "target": state.target,
        "epoch": state.epoch,
        "locked": state.locked,
        "pairs_seen": state.pairs_seen,
        "trips": state.trips,
        "last_decision": state.last_decision,
        "last_similarity": state.last_similarity,
        "updated_at": state.updated_at,
    }


def status_json(
    states: Mapping[str, RouteState],
    stats: StatsLike,
    history: History,
    now: float,
    lag: Mapping[str, int] | None = None,
) -> dict[str, Any]:
    return {
        "now": now,
        "worker": {
            "pairs_scored": stats.pairs_scored,
            "dead_letters": stats.dead_letters,
            "scores_judged": stats.scores_judged,
            "duplicates": stats.duplicates,
            "transitions": stats.transitions,
            "store_errors": stats.store_errors,
        },
        "consumer_lag": dict(lag or {}),
        "routes": [
            {**route_view(r, s), "similarity": [v for _, v in history.points.get(r, ())]}
            for r, s in sorted(states.items())
        ],
    }


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def metrics_text(
    stats: StatsLike,
    states: Mapping[str, RouteState],
    latency: LatencyHistogram,
    lag: Mapping[str, int] | None = None,
) -> str:
    """Prometheus text exposition (version 0.0.4).

    >>> from quantdrift.streams.agents import WorkerStats
    >>> text = metrics_text(WorkerStats(pairs_scored=3), {"r": RouteState(state="open")},
    ...                     LatencyHistogram())
    >>> "quantdrift_pairs_scored_total 3" in text, 'quantdrift_breaker_state{route="r"} 2' in text
    (True, True)
    """
    lines: list[str] = []

    def metric(name: str, kind: str, help_: str, samples: Iterable[tuple[str, float]]) -> None:
        lines.append(f"# HELP {name} {help_}")
        lines.append(f"# TYPE {name} {kind}")
        for labels, value in samples:
            lines.append(f"{name}{labels} {value:g}")

    counters = (
        ("pairs_scored", "pairs scored by this worker"),
        ("dead_letters", "records sent to the DLQ by this worker"),
        ("scores_judged", "scores folded into the breaker"),
        ("duplicates", "redelivered scores dropped by pair_id dedupe"),
        ("transitions", "breaker transitions made by this worker"),
        ("store_errors", "Redis breaker store errors"),
    )
    for attr, help_ in counters:
        metric(f"quantdrift_{attr}_total", "counter", help_, [("", getattr(stats, attr))])
    name = "quantdrift_scoring_seconds"
    lines.append(f"# HELP {name} per-pair scoring latency (batch time / batch size)")
    lines.append(f"# TYPE {name} histogram")
    cumulative = 0
    for bound, count in zip(latency.buckets, latency.counts, strict=False):
        cumulative += count
        lines.append(f'{name}_bucket{{le="{bound:g}"}} {cumulative}')
    lines.append(f'{name}_bucket{{le="+Inf"}} {latency.n}')
    lines.append(f"{name}_sum {latency.total:g}")
    lines.append(f"{name}_count {latency.n}")
    metric(
        "quantdrift_breaker_state",
        "gauge",
        "breaker state per route (0 closed, 1 half_open, 2 open)",
        [(f'{{route="{_label(r)}"}}', STATE_VALUE.get(s.state, -1)) for r, s in states.items()],
    )
    metric(
        "quantdrift_breaker_epoch",
        "gauge",
        "breaker epoch per route",
        [(f'{{route="{_label(r)}"}}', s.epoch) for r, s in states.items()],
    )
    metric(
        "quantdrift_route_similarity",
        "gauge",
        "last shadow-pair similarity per route",
        [
            (f'{{route="{_label(r)}"}}', s.last_similarity)
            for r, s in states.items()
            if s.last_similarity is not None
        ],
    )
    if lag:
        metric(
            "quantdrift_consumer_lag",
            "gauge",
            "records behind the high watermark, per assigned partition",
            [(f'{{partition="{_label(tp)}"}}', v) for tp, v in lag.items()],
        )
    return "\n".join(lines) + "\n"


def sparkline_points(values: Sequence[float], width: int = 160, height: int = 28) -> str:
    """SVG polyline points for a sparkline (the page's script draws the same in JS).

    >>> sparkline_points([1.0, 0.5], width=10, height=10)
    '0.0,0.0 10.0,10.0'
    """
    if not values:
        return ""
    lo = min(0.5, *values)
    step = width / max(len(values) - 1, 1)
    return " ".join(
        f"{i * step:.1f},{(1 - (v - lo) / max(1 - lo, 1e-9)) * height:.1f}"
        for i, v in enumerate(values)
    )


STATUS_HTML = """<!doctype html>
<html><head><meta charset="utf-8"><title>quantdrift status</title>
<style>
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222}
table{border-collapse:collapse} td,th{border:1px solid #ddd;padding:4px 10px;text-align:left}
th{background:#f4f4f4} .closed{color:#117733} .open{color:#cc3311;font-weight:bold}
.half_open{color:#ee7733} #meta{color:#666}
</style></head><body>
<h1>quantdrift worker</h1>
<p id="meta">loading…</p>
<table id="routes"><thead><tr><th>route</th><th>state</th><th>target</th><th>epoch</th>
<th>pairs</th><th>last decision</th><th>similarity</th><th>trend</th></tr></thead>
<tbody></tbody></table>
<script>
"use strict";
function spark(values) {
  const w = 160, h = 28;
  if (!values.length) return "";
  const lo = Math.min(0.5, ...values), step = w / Math.max(values.length - 1, 1);
  const pts = values.map((v, i) =>
    (i * step).toFixed(1) + "," + ((1 - (v - lo) / Math.max(1 - lo, 1e-9)) * h).toFixed(1));
  return '<svg class="spark" width="' + w + '" height="' + h + '" data-n="' + values.length +
    '"><polyline fill="none" stroke="#0072b2" stroke-width="1.5" points="' + pts.join(" ") +
    '"/></svg>';
}
function esc(s) {
  return String(s).replace(/[&<>"]/g, c => ({"&": "&amp;", "<": "&lt;", ">": "&gt;",
    '"': "&quot;"})[c]);
}
let polls = 0;
async function refresh() {
  try {
    const r = await fetch("/status.json", {cache: "no-store"});
    const data = await r.json();
    polls += 1;
    const rows = data.routes.map(x =>
      '<tr class="route" data-route="' + esc(x.route) + '" data-state="' + x.state +
      '" data-pairs="' + x.pairs_seen + '" data-epoch="' + x.epoch + '">' +
      "<td>" + esc(x.route) + "</td>" +
      '<td class="' + x.state + '">' + x.state + (x.locked ? " (locked)" : "") + "</td>" +
      "<td>" + esc(x.target) + "</td><td>" + x.epoch + "</td><td>" + x.pairs_seen +
      "</td><td>" + esc(x.last_decision) + "</td><td>" +
      (x.last_similarity == null ? "–" : x.last_similarity.toFixed(3)) + "</td><td>" +
      spark(x.similarity) + "</td></tr>");
    document.querySelector("#routes tbody").innerHTML = rows.join("");
    const w = data.worker;
    document.getElementById("meta").textContent =
      "pairs scored " + w.pairs_scored + " · dead letters " + w.dead_letters +
      " · transitions " + w.transitions + " · updated " +
      new Date(data.now * 1000).toISOString() + " · poll " + polls;
    document.body.dataset.polls = polls;
  } catch (e) {
    document.getElementById("meta").textContent = "status unavailable: " + e;
  }
}
refresh();
setInterval(refresh, 1000);
</script></body></html>
"""
