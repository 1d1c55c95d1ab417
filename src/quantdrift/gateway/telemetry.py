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
        self.requests = Counter(
            P + "requests",
            "user requests, by outcome",
            ["route", "precision", "outcome"],
            registry=r,
        )
        self.latency = Histogram(
            P + "request_seconds",
            "user request latency, to the last byte",
            ["route", "precision", "stream"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.ttft = Histogram(
            P + "ttft_seconds",
            "time to first token the user receives",
            ["route", "precision"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.tpot = Histogram(
            P + "tpot_seconds",
            "time per output token after the first",
            ["route", "precision"],
            buckets=TPOT_BUCKETS,
            registry=r,
        )
        self.tokens = Counter(
            P + "completion_tokens",
            "completion tokens served (rate = throughput)",
            ["route", "precision"],
            registry=r,
        )
        self.fallbacks = Counter(
            P + "fallbacks",
            "fallbacks to the next precision, by reason",
            ["route", "precision", "reason"],
            registry=r,
        )
        self.fallbacks_refused = Counter(
            P + "fallbacks_refused",
            "fallbacks not taken (retry budget spent, chain deadline)",
            ["route", "reason"],
            registry=r,
        )
        self.final_guard_failures = Counter(
            P + "final_guard_failures",
            "answers of the last precision that failed a guard (returned as they are)",
            ["route", "precision", "reason"],
            registry=r,
        )
        self.truncated = Counter(
            P + "truncated",
            "answers cut by max_tokens (served as they are, not retried)",
            ["route", "precision", "json"],
            registry=r,
        )
        self.stream_cuts = Counter(
            P + "stream_cuts",
            "streams stopped by the degeneration guard after forwarding began",
            ["route", "precision", "reason"],
            registry=r,
        )
        self.stream_errors = Counter(
            P + "stream_errors",
            "upstream failures after forwarding began",
            ["route", "precision", "reason"],
            registry=r,
        )
        self.client_disconnects = Counter(
            P + "client_disconnects",
            "requests whose client left; upstream work cancelled",
            ["route"],
            registry=r,
        )
        self.shadow_sampled = Counter(
            P + "shadow_sampled", "requests sampled for pairs", ["route", "kind"], registry=r
        )
        self.auth_refusals = Counter(
            P + "auth_refusals", "requests refused by auth", ["reason"], registry=r
        )
        self.info = Gauge(P + "up", "1 while the gateway serves", registry=r)
        self.info.set(1)

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
