"""The status page's content: pure functions from route states and worker counters.

``/status`` is a static HTML shell whose script polls ``/status.json`` and
redraws the route table and each route's similarity sparkline (inline SVG);
``/metrics`` is Prometheus text, written by ``prometheus_client``. No I/O here:
``web.py`` mounts the views.
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.process_collector import ProcessCollector

from quantdrift.breaker.readiness import Readiness
from quantdrift.breaker.state import RouteState

STATE_VALUE = {"closed": 0, "half_open": 1, "open": 2}
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class StatsLike(Protocol):
    pairs_scored: int
    dead_letters: int
    scores_judged: int
    duplicates: int
    scores_refused: int
    scoring_failures: int
    transitions: int
    store_errors: int
    batches: int
    scoring_seconds: list[float]


class TierCounts(Protocol):
    """What /metrics reads of the tiered scorer's agreement record
    (``quantdrift.embedding.tiered.Agreement``; status does not import scoring)."""

    pairs: int
    escalated: dict[str, int]
    passed_over: int
    sample_decision_flips: int
    sample_abs_error_sum: float


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


def route_view(route: str, state: RouteState, ready: Readiness | None = None) -> dict[str, Any]:
    """One route's row; with its readiness (``breaker/readiness.py``), whether it is armed
    (closed, unlocked, every relied-on test can fire) and what it misses."""
    armed = ready is not None and ready.armed and state.state == "closed" and not state.locked
    readiness = {} if ready is None else ready.as_json()
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
        "armed": armed,
        "readiness": readiness.get("readiness", "unknown"),
        "missing": readiness.get("missing", []),
        "rules": readiness.get("rules", []),
        # Slices a slice-scoped rollback holds apart: their users are on the reference.
        "held_slices": [
            {"slice": key, "breaker": h.state, "trips": h.trips, "cooldown_s": h.cooldown_s}
            for key, h in sorted(state.held.items())
        ],
    }


SPEND_SIDES = ("reference", "candidate")
SPEND_FIGURES = ("calls", "tokens", "seconds", "teacher_forcing_calls", "unmetered")


def spend_view(reports: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """A route's shadow spend summed over the live gateways' reports, and their shares.

    Each gateway reports its totals since it started (``gateway/control/spend_report.py``):
    per side, calls, tokens, seconds, teacher-forcing calls and calls whose tokens went
    unreported, all spent on shadowing and none on users. The sum is over the gateways
    alive now; a share is each gateway's own (adaptive shares differ across replicas), so
    the page shows their range and the reasons given. None: no gateway reports.

    >>> r = {"calls": 2, "tokens": 30, "seconds": 0.5, "teacher_forcing_calls": 1}
    >>> v = spend_view([{"share": 0.05, "share_reason": "flat", "reference": r},
    ...                 {"share": 0.2, "share_reason": "warming", "reference": r}])
    >>> v["gateways"], v["reference"]["tokens"], v["share_min"], v["share_max"], v["reasons"]
    (2, 60, 0.05, 0.2, ['flat', 'warming'])
    >>> spend_view([]) is None
    True
    """
    if not reports:
        return None
    sides: dict[str, dict[str, float]] = {
        side: dict.fromkeys(SPEND_FIGURES, 0) for side in SPEND_SIDES
    }
    shares: list[float] = []
    reasons: set[str] = set()
    for report in reports:
        for side, totals in sides.items():
            figures = report.get(side)
            if not isinstance(figures, Mapping):
                continue
            for name in SPEND_FIGURES:
                value = figures.get(name)
                if isinstance(value, int | float) and not isinstance(value, bool):
                    totals[name] += value
        share = report.get("share")
        if isinstance(share, int | float) and not isinstance(share, bool):
            shares.append(float(share))
        if isinstance(report.get("share_reason"), str):
            reasons.add(report["share_reason"])
    for totals in sides.values():
        totals["seconds"] = round(totals["seconds"], 3)
    return {
        "gateways": len(reports),
        **sides,
        "share_min": min(shares, default=None),
        "share_max": max(shares, default=None),
        "reasons": sorted(reasons),
    }


def status_json(
    states: Mapping[str, RouteState],
    stats: StatsLike,
    history: History,
    now: float,
    lag: Mapping[str, int] | None = None,
    readiness: Mapping[str, Readiness] | None = None,
    spend: Mapping[str, dict[str, Any] | None] | None = None,
) -> dict[str, Any]:
    """``/status.json``; ``spend``: per route, the live gateways' shadow spend and shares
    (``spend_view``), None or absent where no gateway reports."""
    ready = readiness or {}
    spent = spend or {}
    return {
        "now": now,
        "worker": {
            "pairs_scored": stats.pairs_scored,
            "dead_letters": stats.dead_letters,
            "scores_judged": stats.scores_judged,
            "duplicates": stats.duplicates,
            "scores_refused": stats.scores_refused,
            "scoring_failures": stats.scoring_failures,
            "transitions": stats.transitions,
            "store_errors": stats.store_errors,
        },
        "consumer_lag": dict(lag or {}),
        "routes": [
            {
                **route_view(r, s, ready.get(r)),
                "similarity": [v for _, v in history.points.get(r, ())],
                "shadow_spend": spent.get(r),
            }
            for r, s in sorted(states.items())
        ],
    }


def metrics_text(
    stats: StatsLike,
    states: Mapping[str, RouteState],
    latency: LatencyHistogram,
    lag: Mapping[str, int] | None = None,
    tiers: TierCounts | None = None,
    readiness: Mapping[str, Readiness] | None = None,
) -> str:
    """Prometheus text exposition (version 0.0.4), written by ``prometheus_client``.

    The worker's numbers live in WorkerStats and the breaker states, so they are
    read into metric families at scrape time (a custom collector) rather than
    mirrored into client-library counters; process metrics (CPU, RSS, open fds)
    come from the library's own collectors.

    >>> from quantdrift.streams.agents import WorkerStats
    >>> text = metrics_text(WorkerStats(pairs_scored=3), {"r": RouteState(state="open")},
    ...                     LatencyHistogram())
    >>> "quantdrift_pairs_scored_total 3.0" in text
    True
    >>> 'quantdrift_breaker_state{route="r"} 2.0' in text
    True
    """
    registry = CollectorRegistry(auto_describe=False)
    ProcessCollector(registry=registry)
    registry.register(_WorkerCollector(stats, states, latency, lag, tiers, readiness))
    return generate_latest(registry).decode()


class _WorkerCollector:
    """One scrape's families from the worker's counters, route states and latencies."""

    def __init__(
        self,
        stats: StatsLike,
        states: Mapping[str, RouteState],
        latency: LatencyHistogram,
        lag: Mapping[str, int] | None,
        tiers: TierCounts | None = None,
        readiness: Mapping[str, Readiness] | None = None,
    ) -> None:
        self.stats, self.states, self.latency, self.lag = stats, states, latency, lag
        self.tiers = tiers
        self.readiness = readiness or {}

    def collect(self) -> Iterable[Any]:
        counters = (
            ("pairs_scored", "pairs scored by this worker"),
            ("dead_letters", "records sent to the DLQ by this worker"),
            ("scores_judged", "scores folded into the breaker"),
            ("duplicates", "redelivered scores dropped by pair_id dedupe"),
            ("scores_refused", "unsigned, forged or stale scores dead-lettered by the judge"),
            ("scoring_failures", "pairs whose scoring raised, dead-lettered one by one"),
            ("transitions", "breaker transitions made by this worker"),
            ("store_errors", "Redis breaker store errors"),
        )
        for attr, help_ in counters:
            yield CounterMetricFamily(f"quantdrift_{attr}", help_, value=getattr(self.stats, attr))
        lat = self.latency
        buckets, cumulative = [], 0
        for bound, count in zip(lat.buckets, lat.counts, strict=False):
            cumulative += count
            buckets.append((f"{bound:g}", cumulative))
        buckets.append(("+Inf", lat.n))
        yield HistogramMetricFamily(
            "quantdrift_scoring_seconds",
            "per-pair scoring latency (batch time / batch size)",
            buckets=buckets,
            sum_value=lat.total,
        )
        state = GaugeMetricFamily(
            "quantdrift_breaker_state",
            "breaker state per route (0 closed, 1 half_open, 2 open)",
            labels=["route"],
        )
        epoch = GaugeMetricFamily(
            "quantdrift_breaker_epoch", "breaker epoch per route", labels=["route"]
        )
        similarity = GaugeMetricFamily(
            "quantdrift_route_similarity", "last shadow-pair similarity per route", labels=["route"]
        )
        for route, s in self.states.items():
            state.add_metric([route], STATE_VALUE.get(s.state, -1))
            epoch.add_metric([route], s.epoch)
            if s.last_similarity is not None:
                similarity.add_metric([route], s.last_similarity)
        yield from (state, epoch, similarity)
        if self.readiness:
            armed = GaugeMetricFamily(
                "quantdrift_route_armed",
                "1 when every test the route relies on can fire (closed, unlocked), else 0",
                labels=["route"],
            )
            abstaining = GaugeMetricFamily(
                "quantdrift_route_tests_abstaining",
                "relied-on tests that cannot fire, past min_pairs (no floor, no blessing, ...)",
                labels=["route"],
            )
            for route, ready in self.readiness.items():
                view = route_view(route, self.states.get(route, RouteState()), ready)
                armed.add_metric([route], float(view["armed"]))
                abstaining.add_metric([route], float(len(ready.missing)))
            yield from (armed, abstaining)
        if self.lag:
            lag = GaugeMetricFamily(
                "quantdrift_consumer_lag",
                "records behind the high watermark, per assigned partition",
                labels=["partition"],
            )
            for tp, v in self.lag.items():
                lag.add_metric([tp], v)
            yield lag
        if self.tiers is not None:
            yield from tier_families(self.tiers)


def tier_families(tiers: TierCounts) -> Iterable[Any]:
    """The tiered scorer's escalations and its agreement sample, as counters.

    The sample is what says whether the static tier still stands in for MiniLM on
    this traffic: ``quantdrift_tier_sample_decision_flips_total`` over
    ``quantdrift_tier_escalations_total{reason="sample"}`` is the share of sampled
    pairs whose verdict at a similarity bar the static cosine would have flipped,
    and the absolute-error sum over the same count is the mean gap.

    >>> from types import SimpleNamespace
    >>> counts = SimpleNamespace(pairs=10, escalated={"band": 1, "sample": 0}, passed_over=3,
    ...                          sample_decision_flips=0, sample_abs_error_sum=0.0)
    >>> names = [f.name for f in tier_families(counts)]
    >>> names[0], len(names)
    ('quantdrift_tier_pairs', 5)
    """
    yield CounterMetricFamily(
        "quantdrift_tier_pairs", "pairs the static tier scored first", value=tiers.pairs
    )
    escalations = CounterMetricFamily(
        "quantdrift_tier_escalations",
        "pairs escalated to MiniLM: in the band of a bar, or in the agreement sample",
        labels=["reason"],
    )
    for reason, n in sorted(tiers.escalated.items()):
        escalations.add_metric([reason], n)
    yield escalations
    yield CounterMetricFamily(
        "quantdrift_tier_passed_over",
        "pairs in a bar's band whose draw kept the static cosine",
        value=tiers.passed_over,
    )
    yield CounterMetricFamily(
        "quantdrift_tier_sample_decision_flips",
        "sampled pairs whose verdict at a similarity bar differs between the tiers",
        value=tiers.sample_decision_flips,
    )
    yield CounterMetricFamily(
        "quantdrift_tier_sample_abs_error",
        "sum over sampled pairs of |mapped static cosine - MiniLM cosine|",
        value=tiers.sample_abs_error_sum,
    )


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
<th>pairs</th><th>armed</th><th>last decision</th><th>similarity</th><th>trend</th>
<th title="the share of the route's traffic shadowed now, per live gateway">shadow share</th>
<th title="spent on the reference by shadowing, summed over live gateways (no user traffic)">
reference spend</th></tr></thead>
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
function pct(x) { return (100 * x).toFixed(x < 0.1 ? 1 : 0) + "%"; }
function share(sp) {
  if (!sp || sp.share_min == null) return "–";
  const range = sp.share_min === sp.share_max ? pct(sp.share_min) :
    pct(sp.share_min) + "–" + pct(sp.share_max);
  return range + " (" + sp.reasons.join(", ") + ")";
}
function spent(sp) {
  if (!sp) return "–";
  const r = sp.reference;
  return r.tokens + " tok · " + r.seconds.toFixed(1) + " s · " + r.calls + " calls (" +
    r.teacher_forcing_calls + " forced) · " + sp.gateways + " gw";
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
      '" data-pairs="' + x.pairs_seen + '" data-epoch="' + x.epoch +
      '" data-armed="' + x.armed + '"' + (x.shadow_spend ?
        ' data-share-max="' + x.shadow_spend.share_max + '" data-reference-tokens="' +
        x.shadow_spend.reference.tokens + '" data-reference-seconds="' +
        x.shadow_spend.reference.seconds + '" data-forced="' +
        x.shadow_spend.reference.teacher_forcing_calls + '" data-gateways="' +
        x.shadow_spend.gateways + '"' : "") + ">" +
      "<td>" + esc(x.route) + "</td>" +
      '<td class="' + x.state + '">' + x.state + (x.locked ? " (locked)" : "") +
      x.held_slices.map(h => ' <span class="' + h.breaker + '" data-slice="' + esc(h.slice) +
        '">' + esc(h.slice) + " " + (h.breaker === "open" ? "rolled back" : "half-open") +
        "</span>").join("") + "</td>" +
      "<td>" + esc(x.target) + "</td><td>" + x.epoch + "</td><td>" + x.pairs_seen +
      '</td><td class="armed" title="' + esc(x.missing.join(" | ")) + '">' +
      esc(x.armed ? "armed" : x.readiness) +
      (x.missing.length ? " (" + x.missing.length + " abstaining)" : "") +
      "</td><td>" + esc(x.last_decision) + "</td><td>" +
      (x.last_similarity == null ? "–" : x.last_similarity.toFixed(3)) + "</td><td>" +
      spark(x.similarity) + '</td><td class="share">' + esc(share(x.shadow_spend)) +
      '</td><td class="spend">' + esc(spent(x.shadow_spend)) + "</td></tr>");
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
