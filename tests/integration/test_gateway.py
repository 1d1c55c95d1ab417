"""The gateway against a scripted upstream (a behaviour per path; in memory for the gateway's
own logic, a uvicorn server for the wire),
the real embedded broker and Redis: every fallback path, shadow and noise pairs, commands.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis

from quantdrift.breaker.outbox import OutboxItem
from quantdrift.breaker.policy import RoutePolicy
from quantdrift.breaker.relay import OutboxRelay
from quantdrift.breaker.store import RedisBreakerStore
from quantdrift.config import KafkaSettings, TopicNames
from quantdrift.gateway.control.controller import RouteController
from quantdrift.gateway.control.targets import resolver_for
from quantdrift.gateway.http.service import Gateway
from quantdrift.gateway.shadow.publisher import DegradationPublisher, ShadowPublisher
from quantdrift.schemas import (
    CommandSigner,
    CommandVerifier,
    DegradationEvent,
    PairEvent,
    RouteCommand,
)
from quantdrift.stack import EmbeddedStack, create_topics, free_port
from support.gateway_upstream import (
    GOOD,
    KEY,
    ROOMY,
    ROUTE,
    Scripted,
    chat_body,
    content,
    in_process,
    make_config,
    serving,
    shadow_pairs,
    stream_text,
)
from support.kafka import consume_n, produce, unique_topic

pytestmark = [pytest.mark.timeout(120)]

# -- serving and falling back ------------------------------------------------------------


async def test_serves_the_candidate_streaming_and_not(scripted_memory: Scripted) -> None:
    gw = Gateway(make_config(scripted_memory, GOOD), transport=scripted_memory.transport)
    async with in_process(gw) as client:
        resp = await client.post("/v1/chat/completions", json=chat_body())
        assert resp.status_code == 200, resp.text
        assert resp.headers["x-quantdrift-precision"] == "int4"
        assert content(resp) == "Hello from int4, the answer is forty two."
        assert resp.json()["choices"][0]["logprobs"] is None  # added upstream, not asked for

        sresp, text, finishes, events = await stream_text(client, chat_body())
        assert sresp.headers["x-quantdrift-precision"] == "int4"
        assert text == "Hello from int4, the answer is forty two." and finishes == ["stop"]
        assert all(c.get("logprobs") is None for e in events for c in e["choices"])

        health = (await client.get("/health")).json()
        assert health["routes"][ROUTE]["serving"] == "int4"
        metrics = (await client.get("/metrics")).text
        assert 'quantdrift_gateway_requests_total{outcome="ok",precision="int4"' in metrics


@pytest.mark.parametrize("how", ["header", "body"])
async def test_high_precision_preference_goes_to_the_reference(scripted_memory: Scripted, how: str):
    gw = Gateway(make_config(scripted_memory, GOOD), transport=scripted_memory.transport)
    async with in_process(gw) as client:
        if how == "header":
            kw: dict[str, Any] = {"headers": {"X-Precision-Preference": "high_precision"}}
            body = chat_body()
        else:
            kw, body = {}, chat_body(precision_preference="high_precision")
        resp = await client.post("/v1/chat/completions", json=body, **kw)
        assert resp.headers["x-quantdrift-precision"] == "bf16"
        bad = await client.post("/v1/chat/completions", json=chat_body(precision_preference="x"))
        assert bad.status_code == 400 and bad.json()["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("mode", ["e500", "slow", "stall", "disconnect", "refused"])
async def test_upstream_failures_fall_back_to_the_next_precision(
    scripted: Scripted, mode: str, stream: bool
) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    gw = Gateway(make_config(scripted, {**GOOD, "int4": dead if mode == "refused" else mode}))
    async with serving(gw) as client:
        t0 = time.perf_counter()
        if stream:
            resp, text, _, _ = await stream_text(client, chat_body())
        else:
            resp = await client.post("/v1/chat/completions", json=chat_body())
            text = content(resp)
        took = time.perf_counter() - t0
        assert resp.status_code == 200
        assert resp.headers["x-quantdrift-precision"] == "int8"
        assert text == "Hello from int8, the answer is forty two."
        reason = {
            "e500": "http_500",
            "slow": "timeout",
            "stall": "timeout",
            "disconnect": "disconnect",
            "refused": "connect",
        }[mode]
        assert resp.headers["x-quantdrift-fallbacks"] == f"int4:upstream_{reason}"
        assert (
            gw.metrics.value(
                "quantdrift_gateway_fallbacks_total", precision="int4", reason=f"upstream_{reason}"
            )
            == 1
        )
        assert took < 2.5  # read timeout 0.5 s, not the upstream's 3 s sleep


async def test_retries_connect_errors_and_503_across_a_pool(scripted_memory: Scripted) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    pools = {
        **GOOD,
        "int4": [dead, scripted_memory.base("e503", "int4"), scripted_memory.base("good", "int4")],
    }
    gw = Gateway(make_config(scripted_memory, pools), transport=scripted_memory.transport)
    async with in_process(gw) as client:
        for _ in range(3):  # every rotation of the pool lands on the good URL
            resp = await client.post("/v1/chat/completions", json=chat_body())
            assert resp.headers["x-quantdrift-precision"] == "int4"
            assert "x-quantdrift-fallbacks" not in resp.headers


@pytest.mark.parametrize(
    ("mode", "status", "code"),
    [("e500", 502, "upstream_unavailable"), ("slow", 504, "upstream_timeout")],
)
async def test_every_upstream_failing_is_an_openai_error(
    scripted: Scripted, mode: str, status: int, code: str
) -> None:
    gw = Gateway(make_config(scripted, dict.fromkeys(GOOD, mode)))
    async with serving(gw) as client:
        resp = await client.post("/v1/chat/completions", json=chat_body())
        assert resp.status_code == status
        error = resp.json()["error"]
        assert error["type"] == "upstream_error" and error["code"] == code
        assert "int4 -> int8 -> bf16" in error["message"]
        sresp, *_ = await stream_text(client, chat_body())
        assert sresp.status_code == status


async def test_client_errors_pass_through(scripted_memory: Scripted) -> None:
    gw = Gateway(
        make_config(scripted_memory, {**GOOD, "int4": "e400"}), transport=scripted_memory.transport
    )
    async with in_process(gw) as client:
        marker = f"client-error-{uuid.uuid4().hex[:6]}"
        resp = await client.post("/v1/chat/completions", json=chat_body(marker))
        assert resp.status_code == 400 and resp.json()["error"]["message"] == "bad"
        assert not [b for b in scripted_memory.calls_to("int8") if marker in json.dumps(b)]
        assert gw.metrics.value("quantdrift_gateway_fallbacks_total") == 0


# -- JSON guard and degeneration guard ---------------------------------------------------


JSON_CASES = {
    "badjson": "json_invalid_char",
    "missing": "json_missing_key",
    "ws": "json_whitespace_run",
    "dup": "json_duplicate_key",
    "loop": "json_not_object",  # free text where an object was asked for
}


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("mode", list(JSON_CASES))
async def test_json_guard_cuts_and_retries_silently(
    scripted_memory: Scripted, mode: str, stream: bool
) -> None:
    gw = Gateway(
        make_config(scripted_memory, {**GOOD, "int4": mode}), transport=scripted_memory.transport
    )
    body = chat_body("reply in json", expected_keys=["answer"])
    async with in_process(gw) as client:
        if stream:
            resp, text, finishes, events = await stream_text(client, body)
            assert finishes == ["stop"] and len(events) == 3  # role, the answer, finish
        else:
            resp = await client.post("/v1/chat/completions", json=body)
            text = content(resp)
        assert resp.status_code == 200
        assert resp.headers["x-quantdrift-precision"] == "int8"
        assert json.loads(text) == {"answer": "ok", "precision": "int8"}  # fence stripped
        reason = JSON_CASES[mode]
        assert resp.headers["x-quantdrift-fallbacks"] == f"int4:{reason}"
        assert gw.metrics.value("quantdrift_gateway_fallbacks_total", reason=reason) == 1


async def test_json_schema_required_keys_and_degradation_event(
    scripted_memory: Scripted, stack: EmbeddedStack
) -> None:
    topic = unique_topic("degradations")
    kafka = KafkaSettings(bootstrap_servers=stack.bootstrap)
    gw = Gateway(
        make_config(scripted_memory, {"int4": "missing", "int8": "missing", "bf16": "good"}),
        degradations=DegradationPublisher(kafka, topic=topic),
        transport=scripted_memory.transport,
    )
    schema = {
        "type": "object",
        "required": ["answer"],
        "properties": {"answer": {"type": "string"}},
    }
    body = chat_body(
        "hi",
        response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": schema}},
    )
    async with in_process(gw) as client:
        resp = await client.post(
            "/v1/chat/completions", json=body, headers={"X-Request-Id": "json-req-1"}
        )
        assert resp.headers["x-quantdrift-precision"] == "bf16"
        assert json.loads(content(resp))["answer"] == "ok"
        request_id = resp.headers["x-request-id"]
        records = await consume_n(stack.bootstrap, topic, 2, timeout=15)
    events = sorted((DegradationEvent.parse(r.value) for r in records), key=lambda e: e.precision)
    assert [(e.precision, e.fallback_precision, e.reason) for e in events] == [
        ("int4", "int8", "json_missing_key"),
        ("int8", "bf16", "json_missing_key"),
    ]
    # The gateway's own id names the request; the client's is kept for tracing.
    assert all(e.route == ROUTE and e.request_id == request_id for e in events)
    assert all(e.detail["client_request_id"] == "json-req-1" for e in events)
    assert {r.key for r in records} == {ROUTE.encode()}


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize(("mode", "reason"), [("loop", "loop"), ("collapse", "entropy_collapse")])
async def test_degeneration_guard_falls_back(
    scripted_memory: Scripted, mode: str, reason: str, stream: bool
) -> None:
    gw = Gateway(
        make_config(scripted_memory, {**GOOD, "int4": mode}), transport=scripted_memory.transport
    )
    async with in_process(gw) as client:
        if stream:
            resp, text, *_ = await stream_text(client, chat_body())
        else:
            resp = await client.post("/v1/chat/completions", json=chat_body())
            text = content(resp)
        assert resp.headers["x-quantdrift-precision"] == "int8"
        assert text == "Hello from int8, the answer is forty two."
        assert resp.headers["x-quantdrift-fallbacks"] == f"int4:{reason}"


async def test_a_loop_after_the_holdback_is_stopped_and_recorded(scripted_memory: Scripted) -> None:
    gw = Gateway(
        make_config(scripted_memory, {**GOOD, "int4": "lateloop"}, stream_holdback_tokens=4),
        transport=scripted_memory.transport,
    )
    async with in_process(gw) as client:
        resp, text, finishes, _ = await stream_text(client, chat_body())
        assert resp.headers["x-quantdrift-precision"] == "int4"
        assert text.startswith("w0 w1 w2 w3 ") and finishes == ["length"]
        assert text.count("na ") < 40  # cut before the end of the loop
        assert gw.metrics.value("quantdrift_gateway_stream_cuts_total", reason="loop") == 1


async def test_the_last_precision_is_served_as_it_is(scripted_memory: Scripted) -> None:
    gw = Gateway(
        make_config(scripted_memory, {**GOOD, "bf16": "badjson"}),
        transport=scripted_memory.transport,
    )
    body = chat_body("json please", precision_preference="high_precision", expected_keys=["a"])
    async with in_process(gw) as client:
        resp = await client.post("/v1/chat/completions", json=body)
        assert resp.status_code == 200 and content(resp).startswith('{"answer": "ok",,')
        assert resp.headers["x-quantdrift-fallbacks"] == "bf16:json_invalid_char:served"


# -- shadow, noise and Kafka -------------------------------------------------------------


async def test_shadow_pairs_reach_the_pairs_topic(scripted_memory: Scripted, stack: EmbeddedStack):
    topic = unique_topic("pairs")
    kafka = KafkaSettings(bootstrap_servers=stack.bootstrap)
    publisher = ShadowPublisher(kafka, 1.0, topic=topic)
    gw = Gateway(
        make_config(
            scripted_memory,
            GOOD,
            shadow_sample_rate=1.0,
            teacher_forced=True,
            clear_prompts=True,
            timeouts=ROOMY,
        ),
        publisher=publisher,
        transport=scripted_memory.transport,
    )
    async with in_process(gw) as client:
        resp = await client.post(
            "/v1/chat/completions",
            json=chat_body("shadow me"),
            headers={"X-Request-Id": "shadow-1"},
        )
        assert resp.headers["x-quantdrift-precision"] == "int4"
        assert resp.headers["x-client-request-id"] == "shadow-1"
        first = resp.headers["x-request-id"]
        assert first.startswith("req-") and first != "shadow-1"
        sresp, text, _, _ = await stream_text(
            client,
            chat_body("请再镜像一次这个问题，谢谢。", temperature=0),
            headers={"X-Request-Id": "shadow-2", "X-Quantdrift-Task": "Billing"},
        )
        assert text.startswith("Hello from int4")
        second = sresp.headers["x-request-id"]
        records = await shadow_pairs(gw, publisher, stack.bootstrap, topic, 2)
    pairs = {p.pair_id: p for p in (PairEvent.parse(r.value) for r in records)}
    assert set(pairs) == {f"{first}:shadow", f"{second}:shadow"}
    pair = pairs[f"{first}:shadow"]
    assert pair.kind == "shadow" and pair.route == ROUTE
    assert (pair.candidate.precision, pair.reference.precision) == ("int4", "bf16")
    assert pair.candidate.text == "Hello from int4, the answer is forty two."
    assert pair.reference.text == "Hello from bf16, the answer is forty two."
    assert pair.candidate.top_logprobs and len(pair.candidate.top_logprobs[0]) == 5
    assert pair.reference_logprobs_on_candidate == [-0.25] * 8  # /v1/score on the reference
    assert pair.request.prompt == "user: shadow me"  # the route opted in to clear prompts
    assert pairs[f"{second}:shadow"].request.temperature == 0.0
    # Slice tags, computed once when the gateway planned each request (gateway/chain/slices.py).
    assert pair.tags == {
        "language": "latin", "length": "short", "output": "text", "decoding": "sampled"
    }  # fmt: skip
    assert pairs[f"{second}:shadow"].tags == {
        "language": "zh", "length": "short", "output": "text", "decoding": "greedy",
        "task": "billing",
    }  # fmt: skip
    ref_calls = [b for b in scripted_memory.calls_to("bf16") if "shadow me" in json.dumps(b)]
    assert all(b["logprobs"] is True and b["top_logprobs"] == 5 for b in ref_calls)


async def test_noise_pairs_run_the_reference_twice(scripted_memory: Scripted, stack: EmbeddedStack):
    topic = unique_topic("pairs")
    publisher = ShadowPublisher(KafkaSettings(bootstrap_servers=stack.bootstrap), 1.0, topic=topic)
    gw = Gateway(
        make_config(scripted_memory, GOOD, noise_sample_rate=1.0, timeouts=ROOMY),
        publisher=publisher,
        transport=scripted_memory.transport,
    )
    marker = f"noise-{uuid.uuid4().hex[:6]}"
    async with in_process(gw) as client:
        resp = await client.post("/v1/chat/completions", json=chat_body(marker, temperature=0))
        assert resp.headers["x-quantdrift-precision"] == "int4"
        records = await shadow_pairs(gw, publisher, stack.bootstrap, topic, 1)
    pair = PairEvent.parse(records[0].value)
    assert pair.kind == "noise"
    assert pair.candidate.precision == pair.reference.precision == "bf16"
    temps = [
        b.get("temperature") for b in scripted_memory.calls_to("bf16") if marker in json.dumps(b)
    ]
    # Both reference calls keep the request's decoding: a greedy request's noise pair is
    # greedy-vs-greedy and labelled greedy, never a sampled run in the greedy floor.
    assert temps == [0, 0]
    assert pair.request.temperature == 0 and pair.request.decoding == "greedy"


async def test_a_dead_broker_never_fails_or_delays_users(scripted_memory: Scripted) -> None:
    dead = KafkaSettings(bootstrap_servers=f"127.0.0.1:{free_port()}", request_timeout_ms=500)
    publisher = ShadowPublisher(dead, 1.0, queue_size=2, topic="qdtest.dead.pairs")
    degradations = DegradationPublisher(dead, topic="qdtest.dead.degradations", queue_size=2)
    config = make_config(
        scripted_memory, {**GOOD, "int4": "badjson"}, shadow_sample_rate=1.0, noise_sample_rate=1.0
    )
    gw = Gateway(
        config, publisher=publisher, degradations=degradations, transport=scripted_memory.transport
    )
    async with in_process(gw) as client:
        latencies = []
        for i in range(12):
            body = chat_body(
                "json" if i % 2 else "text", expected_keys=["answer"] if i % 2 else None
            )
            t0 = time.perf_counter()
            resp = await client.post("/v1/chat/completions", json=body)
            latencies.append(time.perf_counter() - t0)
            assert resp.status_code == 200
        await gw.wait_shadows(10)
        assert publisher.stats.dropped.get("queue_full", 0) > 0
        assert not publisher.connected
        metrics = (await client.get("/metrics")).text
        assert (
            'quantdrift_gateway_shadow_dropped_total{reason="queue_full",stage="publish"}'
            in metrics
        )
    print(f"\ndead broker: 12 requests, max user latency {max(latencies) * 1000:.0f} ms")
    assert max(latencies) < 1.0


# -- commands ----------------------------------------------------------------------------


class Console:
    """The breaker's own path for commands: the Redis store and the outbox relay, as
    ``quantdrift route`` and the worker use them (no hand-built commands)."""

    def __init__(self, stack: EmbeddedStack, prefix: str, control: str, signer: CommandSigner):
        self.client = aioredis.Redis.from_url(stack.redis_url)
        self.store = RedisBreakerStore(self.client, signer, key_prefix=prefix)
        self.bootstrap, self.control = stack.bootstrap, control
        self.policy = RoutePolicy(cooldown_s=1.0)

    async def publish(self) -> None:
        async def send(item: OutboxItem) -> None:
            if item.topic == "control":
                await produce(self.bootstrap, self.control, [(ROUTE.encode(), item.value)])

        assert await OutboxRelay(self.store, send, "test-console").flush(ROUTE) == 2

    async def manual(self, action: str, now: float) -> None:
        await self.store.manual(ROUTE, action, self.policy, now)
        await self.publish()

    async def tick(self, now: float) -> None:
        result = await self.store.tick(ROUTE, self.policy, now)
        assert result.outbox is not None
        await self.publish()


async def test_a_signed_rollback_moves_new_requests_within_a_second(
    scripted_memory: Scripted, stack: EmbeddedStack, redis_prefix: str
) -> None:
    control = unique_topic("control")
    pairs_topic = unique_topic("pairs")
    await create_topics(stack.bootstrap, [control], partitions=1)
    kafka = KafkaSettings(
        bootstrap_servers=stack.bootstrap, topics=TopicNames(control=control, pairs=pairs_topic)
    )
    config = make_config(scripted_memory, GOOD, shadow_sample_rate=1.0)
    controller = RouteController(
        kafka,
        stack.redis_url,
        CommandVerifier({"k1": KEY}),
        key_prefix=redis_prefix,
        control_topic=control,
        resolve=resolver_for(config),
    )
    publisher = ShadowPublisher(kafka, 1.0)
    gw = Gateway(
        config, controller=controller, publisher=publisher, transport=scripted_memory.transport
    )
    console = Console(stack, redis_prefix, control, CommandSigner("k1", KEY))

    async def serving_precision(client: httpx.AsyncClient) -> str:
        resp = await client.post("/v1/chat/completions", json=chat_body())
        assert resp.status_code == 200, resp.text
        return resp.headers["x-quantdrift-precision"]

    async with in_process(gw) as client:
        assert await controller.wait_kafka_ready(15)
        assert await serving_precision(client) == "int4"

        sent = time.monotonic()
        now = time.time()
        await console.manual("rollback", now)  # what `quantdrift route rollback` does
        while await serving_precision(client) != "bf16":
            assert time.monotonic() - sent < 5, "rollback never took effect"
        switched = time.monotonic() - sent
        print(f"\nrollback: publish -> first request on bf16 in {switched * 1000:.0f} ms")
        assert switched < 1.0
        rollback_epoch = controller.epoch(ROUTE)

        # A forged restore (wrong key) changes nothing; forgeries are hand-made by nature.
        forged = CommandSigner("k1", b"not-the-key").seal(
            RouteCommand(
                command_id="forged",
                route=ROUTE,
                action="restore",
                target="candidate",
                epoch=rollback_epoch + 10,
                issued_at=time.time(),
            )
        )
        await produce(stack.bootstrap, control, [(ROUTE.encode(), forged)])
        async with asyncio.timeout(5):
            while not controller.verifier.refused.get("bad_signature"):
                await asyncio.sleep(0.02)
        assert await serving_precision(client) == "bf16"
        assert controller.epoch(ROUTE) == rollback_epoch

        # Released, the cool-down passes: half-open, from the breaker's own clock step.
        await console.manual("release", now + 0.5)
        await console.tick(now + 2.0)
        await controller.wait_for(ROUTE, lambda c: c.action == "canary", timeout=5)
        resp = await client.post("/v1/chat/completions", json=chat_body("probe"))
        assert resp.headers["x-quantdrift-precision"] == "bf16"
        request_id = resp.headers["x-request-id"].encode()
        records = await consume_n(
            stack.bootstrap,
            pairs_topic,
            1,
            timeout=15,
            predicate=lambda r: request_id in r.value,
        )
        pair = PairEvent.parse(records[0].value)
        assert (pair.candidate.precision, pair.reference.precision) == ("int4", "bf16")
        assert (await client.get("/health")).json()["routes"][ROUTE]["mode"] == "half_open"

        # A manual restore puts users back on the candidate.
        await console.manual("restore", now + 3.0)
        await controller.wait_for(ROUTE, lambda c: c.action == "restore", timeout=5)
        assert await serving_precision(client) == "int4"
    await console.client.aclose()


# -- capacity: disconnects, one deadline, the retry budget, outliers ---------------------


async def test_a_client_that_leaves_cancels_the_upstream_call(scripted: Scripted) -> None:
    timeouts = {"connect_s": 0.5, "read_s": 2, "total_s": 10, "chain_s": 10}
    gw = Gateway(make_config(scripted, {**GOOD, "int4": "hang"}, timeouts=timeouts))
    marker = f"leaving-{uuid.uuid4().hex[:6]}"
    async with serving(gw) as client:
        with pytest.raises(httpx.ReadTimeout):
            await client.post("/v1/chat/completions", json=chat_body(marker), timeout=0.5)
        async with asyncio.timeout(5):
            while gw.metrics.value("quantdrift_gateway_client_disconnects_total") < 1:
                await asyncio.sleep(0.05)
    assert not [b for b in scripted.calls_to("int8") if marker in json.dumps(b)]  # no retry


async def test_one_deadline_for_the_whole_chain(scripted: Scripted) -> None:
    timeouts = {"connect_s": 0.5, "read_s": 0.4, "total_s": 10, "chain_s": 0.7}
    gw = Gateway(make_config(scripted, dict.fromkeys(GOOD, "stall"), timeouts=timeouts))
    async with serving(gw) as client:
        t0 = time.perf_counter()
        resp = await client.post("/v1/chat/completions", json=chat_body())
        took = time.perf_counter() - t0
    assert resp.status_code == 504
    assert resp.json()["error"]["code"] in ("deadline_exceeded", "upstream_timeout")
    assert took < 1.5  # three attempts of 0.4 s each would be 1.2 s plus the stalls


async def test_the_retry_budget_stops_a_cascade(scripted_memory: Scripted) -> None:
    budget = {"ratio": 0.0, "min_per_window": 2, "window_s": 60}
    gw = Gateway(
        make_config(scripted_memory, {**GOOD, "int4": "e500"}, retry_budget=budget),
        transport=scripted_memory.transport,
    )
    async with in_process(gw) as client:
        codes = [(await client.post("/v1/chat/completions", json=chat_body())).status_code
                 for _ in range(4)]  # fmt: skip
    assert codes == [200, 200, 502, 502]
    assert gw.metrics.value("quantdrift_gateway_fallbacks_refused_total", reason="budget") == 2


async def test_a_failing_server_is_ejected_from_its_pool(scripted_memory: Scripted) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    pools = {**GOOD, "int4": [dead, scripted_memory.base("good", "int4")]}
    outlier = {"consecutive_failures": 1, "base_ejection_s": 60, "max_ejection_s": 60}
    gw = Gateway(
        make_config(scripted_memory, pools, outlier=outlier), transport=scripted_memory.transport
    )
    async with in_process(gw) as client:
        for _ in range(4):
            resp = await client.post("/v1/chat/completions", json=chat_body())
            assert resp.headers["x-quantdrift-precision"] == "int4"
        metrics = (await client.get("/metrics")).text
    assert gw.upstreams["int4"].outliers.ejected_total == 1  # once, then skipped
    assert 'quantdrift_gateway_upstream_ejections_total{precision="int4"} 1.0' in metrics


async def test_with_the_budget_spent_a_guarded_answer_is_served_whole(
    scripted_memory: Scripted,
) -> None:
    budget = {"ratio": 0.0, "min_per_window": 1, "window_s": 60}
    gw = Gateway(
        make_config(scripted_memory, {**GOOD, "int4": "badjson"}, retry_budget=budget),
        transport=scripted_memory.transport,
    )
    body = chat_body("json please", expected_keys=["answer"])
    async with in_process(gw) as client:
        first = await client.post("/v1/chat/completions", json=body)
        second = await client.post("/v1/chat/completions", json=body)
    assert first.headers["x-quantdrift-precision"] == "int8"  # the one fallback in the budget
    assert second.headers["x-quantdrift-precision"] == "int4"  # then int4's answer, whole
    assert second.headers["x-quantdrift-fallbacks"] == "int4:json_invalid_char:served"
    assert content(second).endswith('"}')  # not cut where the guard tripped
    assert gw.metrics.value("quantdrift_gateway_fallbacks_refused_total", reason="budget") == 1


async def test_a_reference_that_cannot_teacher_force_is_reported_once_and_counted(
    scripted_memory: Scripted, stack: EmbeddedStack, caplog: pytest.LogCaptureFixture
):
    """The scripted_memory reference has no ``/tokenize``: a pool declared ``teacher_forcing:
    vllm`` on it is found unable at start (gauge 0, one log line), and its pairs go
    out without teacher-forced log-probs, each one counted."""
    topic = unique_topic("pairs")
    publisher = ShadowPublisher(KafkaSettings(bootstrap_servers=stack.bootstrap), 1.0, topic=topic)
    config = make_config(
        scripted_memory,
        GOOD,
        shadow_sample_rate=1.0,
        teacher_forced=True,
        pools={"bf16": {"teacher_forcing": "vllm"}},
    )
    gw = Gateway(config, publisher=publisher, transport=scripted_memory.transport)
    with caplog.at_level("INFO", logger="quantdrift.gateway.shadow.runner"):
        async with in_process(gw) as client:
            deadline = time.monotonic() + 10
            while "bf16" not in gw.shadow.probe.tf_ready:
                assert time.monotonic() < deadline, "the startup probe never concluded"
                await asyncio.sleep(0.05)
            for i in range(2):
                resp = await client.post("/v1/chat/completions", json=chat_body(f"no tf {i}"))
                assert resp.status_code == 200
            records = await consume_n(stack.bootstrap, topic, 2, timeout=15)
            metrics = (await client.get("/metrics")).text
    pairs = [PairEvent.parse(r.value) for r in records]
    assert [p.reference_logprobs_on_candidate for p in pairs] == [None, None]
    assert 'teacher_forcing_ready{mode="vllm",pool="bf16"} 0.0' in metrics
    counted = [ln for ln in metrics.splitlines() if 'reason="tf_unsupported"' in ln]
    assert counted and counted[0].endswith(" 2.0"), counted
    said = [r.getMessage() for r in caplog.records if "not supported by its server" in r.message]
    assert len(said) == 1 and "/tokenize: HTTP 404" in said[0], said
