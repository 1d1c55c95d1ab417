"""The collector in process, against the scripted upstream and the real broker: a mirrored
request becomes the pair the gateway would have published (in memory: the gateway's own
logic), and nothing behind the collector (a slow reference, a full queue) slows its 202
(on the wire: a latency). The same collector behind a real nginx is
``test_nginx.py``."""

from __future__ import annotations

import asyncio
import json
import statistics
import time
import uuid
from typing import Any

import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from quantdrift.config import KafkaSettings
from quantdrift.gateway.control.evidence import EvidenceWatch
from quantdrift.gateway.foreign.collector import create_collector_app
from quantdrift.gateway.http.service import Gateway
from quantdrift.gateway.shadow.publisher import ShadowPublisher
from quantdrift.schemas import PairEvent
from quantdrift.schemas.keys import route_key
from quantdrift.stack import EmbeddedStack
from support.gateway_upstream import (
    GOOD,
    ROOMY,
    ROUTE,
    Scripted,
    chat_body,
    in_process,
    make_config,
    serving,
    shadow_pairs,
)
from support.kafka import unique_topic

pytestmark = [pytest.mark.timeout(120)]

SHARE = 0.05  # what the gateway in front mirrors (nginx split_clients 5 %)


def comparable(pair: PairEvent) -> dict[str, Any]:
    """A pair without what differs between two runs of one request: ids, times, rates."""
    data = pair.model_dump(mode="json", exclude={"pair_id", "ts", "sample_rate"})
    for side in ("candidate", "reference"):
        data[side].pop("latency_ms", None)
    return data


async def test_a_mirrored_request_becomes_the_pair_the_gateway_publishes(
    scripted_memory: Scripted,
    stack: EmbeddedStack,
) -> None:
    kafka = KafkaSettings(bootstrap_servers=stack.bootstrap)
    config = make_config(
        scripted_memory,
        GOOD,
        shadow_sample_rate=1.0,
        teacher_forced=True,
        clear_prompts=True,
        timeouts=ROOMY,
        collector={"mirrored_share": SHARE},
        sample_salt="s",
    )
    marker = f"mirror-{uuid.uuid4().hex[:6]}"
    body = chat_body(f"{marker} what is the capital of France?", temperature=0)

    # The gateway serves the request and mirrors it itself ...
    gw_topic = unique_topic("pairs")
    gw_pub = ShadowPublisher(kafka, 1.0, topic=gw_topic)
    gw = Gateway(config, publisher=gw_pub, transport=scripted_memory.transport)
    async with in_process(gw) as client:
        assert (await client.post("/v1/chat/completions", json=body)).status_code == 200
        [gw_record] = await shadow_pairs(gw, gw_pub, stack.bootstrap, gw_topic, 1)
    candidate_calls = len([b for b in scripted_memory.calls_to("int4") if marker in json.dumps(b)])
    assert candidate_calls == 1  # the user's call: the pair reuses its answer

    # ... and the collector, given the same request as a mirror, asks both sides itself.
    topic = unique_topic("pairs")
    publisher = ShadowPublisher(kafka, 1.0, topic=topic)
    collector = Gateway(
        config, publisher=publisher, mirrored_share=SHARE, transport=scripted_memory.transport
    )
    async with in_process(collector, create_collector_app) as client:
        resp = await client.post("/v1/chat/completions", json=body)
        assert resp.status_code == 202, resp.text
        assert resp.json()["outcome"] == "accepted" and resp.json()["route"] == ROUTE
        private = await client.post(
            "/v1/chat/completions",
            json={**chat_body(f"{marker} private", temperature=0), "stream": True},
            headers={"X-Quantdrift-Private": "1"},
        )
        assert private.status_code == 202 and private.json()["outcome"] == "accepted"
        records = await shadow_pairs(collector, publisher, stack.bootstrap, topic, 2)
        metrics = (await client.get("/metrics")).text
    pairs = {p.pair_id: p for p in (PairEvent.parse(r.value) for r in records)}
    mirrored = pairs[f"{resp.json()['id']}:shadow"]
    assert comparable(mirrored) == comparable(PairEvent.parse(gw_record.value))
    assert mirrored.reference_logprobs_on_candidate == [-0.25] * 8  # teacher-forced
    assert mirrored.request.prompt is not None and marker in mirrored.request.prompt
    assert mirrored.sample_rate == pytest.approx(SHARE)  # its share of the route's traffic
    hidden = pairs[f"{private.json()['id']}:shadow"]
    assert hidden.request.prompt is None and hidden.request.prompt_hash
    calls = [b for b in scripted_memory.calls_to("int4") if marker in json.dumps(b)]
    assert len(calls) == candidate_calls + 2  # the collector called the candidate itself
    assert f'collector_requests_total{{outcome="accepted",route="{ROUTE}"}} 2.0' in metrics
    # A collector serves no one, so both sides' calls are shadow spend, apart by side.
    spent = {
        (s.labels["side"], s.labels["purpose"]): s.value
        for family in text_string_to_metric_families(metrics)
        for s in family.samples
        if s.name == "quantdrift_gateway_shadow_spend_calls_total" and s.labels["route"] == ROUTE
    }
    assert spent == {("candidate", "shadow"): 2, ("reference", "shadow"): 2,
                     ("reference", "teacher_forcing"): 2}  # fmt: skip


async def test_a_slow_reference_and_a_full_queue_never_slow_the_202(
    scripted: Scripted,
    stack: EmbeddedStack,
) -> None:
    """The reference takes 3 s per answer; 40 mirrors arrive at once behind a queue of 4.
    Every one gets its 202 at once, the overflow is dropped and counted, never waited on."""
    config = make_config(
        scripted,
        {"int4": "good", "bf16": "slow"},
        shadow_sample_rate=1.0,
        shadow_queue=4,
        shadow_concurrency=1,
        shadow_drain_s=0.0,
        timeouts=ROOMY,
    )
    topic = unique_topic("pairs")
    publisher = ShadowPublisher(KafkaSettings(bootstrap_servers=stack.bootstrap), 1.0, topic=topic)
    collector = Gateway(config, publisher=publisher)
    async with serving(collector, create_collector_app) as client:

        async def mirror(i: int) -> tuple[int, float, str]:
            t0 = time.monotonic()
            r = await client.post("/v1/chat/completions", json=chat_body(f"load {i}"))
            return r.status_code, time.monotonic() - t0, r.json().get("outcome", "")

        replies = await asyncio.gather(*(mirror(i) for i in range(40)))
        unknown = await client.post(
            "/v1/chat/completions", json={**chat_body(), "route": "no/such-route"}
        )
        assert unknown.status_code == 404
        metrics = (await client.get("/metrics")).text
        dropped = collector.shadow.dropped.get("queue_full", 0)
    took = sorted(t for _, t, _ in replies)
    print(
        f"\ncollector 202s under a 3 s reference and a full queue: median "
        f"{statistics.median(took) * 1000:.1f} ms, max {took[-1] * 1000:.1f} ms "
        f"(40 concurrent); queue_full drops {dropped}"
    )
    assert {(status, outcome) for status, _, outcome in replies} == {(202, "accepted")}
    # Far below the reference's 3 s: nothing behind the queue is ever awaited.
    assert took[-1] < 1.0
    # 40 jobs, one running, four queued: at least 35 dropped oldest-first and counted.
    assert dropped >= 35
    assert 'shadow_dropped_total{reason="queue_full",stage="queue"}' in metrics
    assert 'collector_requests_total{outcome="refused",route="-"} 1.0' in metrics


async def test_the_collectors_share_follows_the_route_evidence_as_the_gateways_does(
    scripted_memory: Scripted,
    stack: EmbeddedStack,
) -> None:
    """One rule (``control/share.py``) for both roles: a collector with ``adaptive_share``
    reads the breaker's state for the route as the gateway does, and dual-runs the most
    of what is mirrored while the route is warming, the floor once it is armed and quiet."""
    prefix = f"qdtest:{uuid.uuid4().hex}:"
    state = route_key(prefix, ROUTE, "state")
    ready = {"armed": True, "progress": 0.0, "short_slices": 0, "slices": 0}
    armed_quiet = {"state": "closed", "pairs_seen": 99, "readiness": ready}
    config = make_config(
        scripted_memory, GOOD, timeouts=ROOMY, noise_sample_rate=0.0, sample_salt="s",
        collector={"mirrored_share": SHARE},
        adaptive_share={"floor": 0.0, "max": 1.0, "refresh_s": 0.1},
    )  # fmt: skip
    evidence = EvidenceWatch(config, stack.redis_url, prefix)
    collector = Gateway(
        config,
        publisher=ShadowPublisher(
            KafkaSettings(bootstrap_servers=stack.bootstrap), 1.0, topic=unique_topic("pairs")
        ),
        evidence=evidence,
        mirrored_share=SHARE,
        transport=scripted_memory.transport,
    )
    r = redis.Redis.from_url(stack.redis_url)

    async def outcomes(client: Any, tag: str, n: int = 20) -> set[str]:
        got = set()
        for i in range(n):
            body = chat_body(f"share {tag} {i}", temperature=0.7)
            resp = await client.post("/v1/chat/completions", json=body)
            assert resp.status_code == 202, resp.text
            got.add(resp.json()["outcome"])
        return got

    async def until_reason(client: Any, reason: str) -> dict[str, Any]:
        async with asyncio.timeout(10):
            while True:
                view = (await client.get("/health")).json()["routes"][ROUTE]["shadow_share"]
                if view["reason"] == reason:
                    return dict(view)
                await asyncio.sleep(0.05)

    try:
        async with in_process(collector, create_collector_app) as client:
            # No state yet: warming, the max: every mirrored request is dual-run.
            assert (await until_reason(client, "warming"))["share"] == 1.0
            assert await outcomes(client, "warming") == {"accepted"}
            # The worker's state says armed, its tests far from their thresholds: the floor.
            r.hset(state, mapping={"v": 1, "s": json.dumps(armed_quiet)})
            assert (await until_reason(client, "quiet"))["share"] == 0.0
            assert await outcomes(client, "quiet") == {"not_sampled"}
            assert collector.spend_figures()[ROUTE]["share"] == 0.0  # times mirrored_share
            # A change of engine restarts the evidence (the state says warming): the max again.
            r.delete(state)
            await until_reason(client, "warming")
            assert collector.spend_figures()[ROUTE]["share"] == pytest.approx(SHARE)
    finally:
        r.delete(state)
        r.close()
