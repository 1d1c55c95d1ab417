"""Several workers on one route: per-worker counters, a paced producer that counts what it sent.

Each worker gets its own web port so the test reads what *that* worker did
(``/status.json``: pairs it scored, scores it judged), not the group's sum.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
from aiokafka import AIOKafkaProducer
from prometheus_client.parser import text_string_to_metric_families

from quantdrift.config import Settings
from quantdrift.demo import synthetic
from quantdrift.demo.workers import WorkerProcess
from quantdrift.schemas import PairEvent
from quantdrift.schemas.record_keys import pair_record_key
from quantdrift.stack import free_port
from support.guard import on_route, route_state, shadow_only
from support.workers import start_worker

WARM_ROUTE = "warmup/int4"


def worker_with_web(settings: Settings, redis_url: str) -> tuple[WorkerProcess, int]:
    """A started worker whose status page serves on a port of its own."""
    port = free_port()
    return start_worker(settings, redis_url, web_port=port), port


async def worker_counts(port: int) -> dict[str, Any]:
    """The worker's own counters (pairs_scored, scores_judged, duplicates, ...)."""
    async with httpx.AsyncClient(timeout=2.0) as client:
        resp = await client.get(f"http://127.0.0.1:{port}/status.json")
        resp.raise_for_status()
        return dict(resp.json()["worker"])


async def tier_counts(port: int) -> dict[str, float]:
    """The worker's tiered-scorer counters from its /metrics: pairs through the static
    tier and escalations by reason (``band``, ``sample``)."""
    async with httpx.AsyncClient(timeout=2.0) as client:
        resp = await client.get(f"http://127.0.0.1:{port}/metrics")
        resp.raise_for_status()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(resp.text):
        for sample in family.samples:
            if sample.name == "quantdrift_tier_pairs_total":
                out["pairs"] = sample.value
            elif sample.name == "quantdrift_tier_escalations_total":
                out[sample.labels["reason"]] = sample.value
    return out


async def scored_by(port: int) -> int | None:
    """Pairs this worker scored, or None while its web server is not up yet."""
    try:
        return int((await worker_counts(port))["pairs_scored"])
    except (httpx.HTTPError, KeyError, ValueError):
        return None


def healthy_then_drifted(route: str, healthy: int, drifted: int, seed: int) -> list[PairEvent]:
    pairs = on_route(shadow_only(synthetic.healthy(route, seed=seed), healthy), route, "s")
    return pairs + on_route(
        shadow_only(synthetic.drifted(route, seed=seed + 50), drifted), route, "s"
    )


async def warm_all(
    settings: Settings, workers: list[tuple[WorkerProcess, int]], timeout: float = 180.0
) -> None:
    """Send warm-up pairs (keyed by pair id) until every worker has scored one.

    A condition, not a sleep: it proves every worker is in the group and owns a
    share of the pairs topic before the test starts counting.
    """
    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka.bootstrap_servers, acks="all")
    await producer.start()
    source = synthetic.healthy(WARM_ROUTE, seed=0)
    deadline = time.monotonic() + timeout
    try:
        for i in itertools.count():
            counts = [await scored_by(port) for _, port in workers]
            if all(c is not None and c > 0 for c in counts):
                break
            for worker, _ in workers:
                assert worker.alive(), f"worker died while warming:\n{worker.log_tail()}"
            assert time.monotonic() < deadline, f"not every worker scored: {counts}"
            pair = next(p for p in source if p.kind == "shadow")
            pair = pair.model_copy(update={"pair_id": f"warm-{i}", "route": WARM_ROUTE})
            await producer.send_and_wait(
                settings.kafka.topics.pairs, pair.dumps(), key=pair_record_key(pair)
            )
            await asyncio.sleep(0.3)
    finally:
        await producer.stop()
    # Every warm-up pair judged: the counters stand still before the test reads them.
    while await judged(settings, [WARM_ROUTE]) < i:
        assert time.monotonic() < deadline, "warm-up pairs not all judged"
        await asyncio.sleep(0.1)


@dataclass
class PacedProducer:
    """Produce pairs keyed by pair id at a fixed rate; ``sent`` is what the broker acked.

    ``hold_at``: the pairs from this index on wait until ``release`` is set. A fault test
    that kills workers mid-stream holds the tail, so a backlog the survivors clear in a
    burst cannot finish the stream between the test's "pairs in flight" check and its kill.
    """

    bootstrap: str
    topic: str
    pairs: list[PairEvent]
    rate_per_s: float
    hold_at: int | None = None
    sent: int = 0
    done: asyncio.Event = field(default_factory=asyncio.Event)
    release: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def holding(self) -> bool:
        """Whether the producer waits at ``hold_at`` with every pair before it acked."""
        return self.sent == self.hold_at and not self.release.is_set()

    async def run(self) -> None:
        producer = AIOKafkaProducer(bootstrap_servers=self.bootstrap, acks="all", linger_ms=5)
        await producer.start()
        try:
            start = time.monotonic()
            for i, pair in enumerate(self.pairs):
                if i == self.hold_at:
                    await self.release.wait()
                    start = time.monotonic() - i / self.rate_per_s  # the pace resumes here
                delay = start + i / self.rate_per_s - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                await producer.send_and_wait(self.topic, pair.dumps(), key=pair_record_key(pair))
                self.sent += 1
        finally:
            await producer.stop()
            self.done.set()


async def judged(settings: Settings, routes: list[str]) -> int:
    """Distinct pairs the judge has folded over ``routes`` (Redis, the judge's own count)."""
    assert settings.redis.url is not None
    total = 0
    for route in routes:
        total += (
            await route_state(settings.redis.url, settings.redis.key_prefix, route)
        ).pairs_seen
    return total
