"""The gateway's metrics, with ``prometheus_client``: one registry per Gateway.

What an operator compares across precisions: request latency, time to first
token (TTFT) and time per output token (TPOT) histograms per route and
precision, completion tokens (throughput is their rate), fallbacks and
degradations by reason, the shadow queue (depth, in flight, drops by reason),
refused commands, auth refusals, and the process itself (CPU, RSS, fds, GC).

Counters the request path owns are prometheus_client objects; numbers other
components already keep (the publisher's stats, the controller's refusals, the
shadow runner's queue) are read at scrape time by ``_Live``, so nothing is
counted twice. A registry per Gateway (not the global one) lets tests and
benchmarks run several gateways in one process.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.gc_collector import GCCollector
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# Seconds: TTFT from a few ms (loopback) to a minute (a cold 70B prefill).
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.035, 0.05, 0.075, 0.1, 0.2, 0.5, 1)
P = "quantdrift_gateway_"


class Telemetry:
    """The request path's instruments, and ``value()`` for tests to read them."""

    def __init__(self, process: bool = True) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        if process:
            ProcessCollector(registry=r)
            PlatformCollector(registry=r)
            GCCollector(registry=r)
        route, rp, rpr = ["route"], ["route", "precision"], ["route", "precision", "reason"]
        self.requests = self._counter("requests", "user requests, by outcome", [*rp, "outcome"])
        self.latency = self._histogram(
            "request_seconds", "user request latency, to the last byte", [*rp, "stream"]
        )
        self.ttft = self._histogram("ttft_seconds", "time to first token the user receives", rp)
        self.tpot = self._histogram(
            "tpot_seconds", "time per output token after the first", rp, TPOT_BUCKETS
        )
        self.tokens = self._counter(
            "completion_tokens", "completion tokens served (rate = throughput)", rp
        )
        self.fallbacks = self._counter(
            "fallbacks", "fallbacks to the next precision, by reason", rpr
        )
        self.fallbacks_refused = self._counter(
            "fallbacks_refused",
            "fallbacks not taken (retry budget spent, chain deadline)",
            [*route, "reason"],
        )
        self.final_guard_failures = self._counter(
            "final_guard_failures",
            "answers of the last precision that failed a guard (returned as they are)",
            rpr,
        )
        self.truncated = self._counter(
            "truncated",
            "answers cut by max_tokens (served as they are, not retried)",
            [*rp, "json"],
        )
        self.stream_cuts = self._counter(
            "stream_cuts", "streams stopped by the degeneration guard after forwarding began", rpr
        )
        self.stream_errors = self._counter(
            "stream_errors", "upstream failures after forwarding began", rpr
        )
        self.client_disconnects = self._counter(
            "client_disconnects", "requests whose client left; upstream work cancelled", route
        )
        self.shadow_sampled = self._counter(
            "shadow_sampled", "requests sampled for pairs", [*route, "kind"]
        )
        self.auth_refusals = self._counter("auth_refusals", "requests refused by auth", ["reason"])
        self.mirrored = self._counter(
            "collector_requests",
            "mirrored requests a collector received, by outcome (accepted: queued for a "
            "dual run; not_sampled; suspended: the route's candidate may not run; refused; "
            "shed: the collector was overloaded)",
            [*route, "outcome"],
        )
        self.shed = self._counter(
            "shed",
            "requests refused with 503 because the gateway itself was overloaded "
            "(admission: at the door; in_flight: a timeout its own loop lag caused)",
            ["stage"],
        )
        self.lingering_closes = self._counter(
            "lingering_closes",
            "connections closed after an answer sent before the body was read: the rest "
            "was read and discarded until the client closed (eof) or a bound (idle, "
            "deadline), so the client could read the answer (``lingering.py``)",
            ["end"],
        )
        self.lingered_bytes = self._counter(
            "lingered_bytes", "request body bytes read and discarded by lingering closes", []
        )
        self.info = Gauge(P + "up", "1 while the gateway serves", registry=r)
        self.info.set(1)

    def _counter(self, name: str, help_: str, labels: list[str]) -> Counter:
        """One of this gateway's counters: the common prefix, its own registry."""
        return Counter(P + name, help_, labels, registry=self.registry)

    def _histogram(
        self, name: str, help_: str, labels: list[str], buckets: tuple[float, ...] = LATENCY_BUCKETS
    ) -> Histogram:
        """One of this gateway's histograms (seconds: latency buckets unless told)."""
        return Histogram(P + name, help_, labels, buckets=buckets, registry=self.registry)

    def live(self, collect: Callable[[], Iterator[Metric]]) -> None:
        """Add numbers read at scrape time (other components' own counters)."""
        self.registry.register(_Live(collect))

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def value(self, name: str, **labels: str) -> float:
        """Sum of the samples called ``name`` whose labels include ``labels`` (tests)."""
        total = 0.0
        for metric in self.registry.collect():
            for s in metric.samples:
                if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                    total += s.value
        return total


class _Live(Collector):
    def __init__(self, collect: Callable[[], Iterator[Metric]]) -> None:
        self._collect = collect

    def collect(self) -> Iterator[Metric]:
        yield from self._collect()

    def describe(self) -> list[Metric]:
        return []


def counter(name: str, help_: str, labels: list[str], rows: Mapping[Any, float]) -> Any:
    """A counter family from ``{label values: value}`` (name without ``_total``)."""
    family = CounterMetricFamily(P + name, help_, labels=labels)
    for values, v in sorted(rows.items()):
        family.add_metric(list(values), v)
    return family


def gauge(name: str, help_: str, labels: list[str], rows: Mapping[Any, float]) -> Any:
    family = GaugeMetricFamily(P + name, help_, labels=labels)
    for values, v in sorted(rows.items()):
        family.add_metric(list(values), v)
    return family
