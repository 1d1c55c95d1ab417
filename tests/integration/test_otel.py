"""OpenTelemetry: evaluation events from the judge, GenAI spans from the gateway.

* Off by default: no environment, no telemetry, hooks do nothing.
* The SDK's in-memory exporters: the judge's hook over real RedisBreakerStore folds
  (one event per newly judged pair, none for redeliveries, one per transition), and
  the gateway's span for an openai-SDK call, joined to the PairEvent on the real
  broker by ``quantdrift.pair_id``.
* Once over the wire: a real ``quantdrift worker`` process exports OTLP/HTTP to a
  receiver (``support.otlp``), which decodes the protobuf export requests.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import openai
import pytest
from opentelemetry.sdk._logs.export import InMemoryLogRecordExporter
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from quantdrift import otel
from quantdrift.breaker.policy import RoutePolicy
from quantdrift.breaker.store import RedisBreakerStore
from quantdrift.config import KafkaSettings, TopicNames
from quantdrift.demo import synthetic
from quantdrift.gateway.gateway_config import parse_config
from quantdrift.gateway.http.service import Gateway
from quantdrift.gateway.shadow.publisher import ShadowPublisher
from quantdrift.schemas import Metrics, PairEvent, ScoreEvent
from quantdrift.stack import EmbeddedStack
from quantdrift.stack.broker import create_topics
from support.gateway_upstream import in_memory as in_memory_upstream
from support.gateway_upstream import in_process
from support.guard import isolated_settings, make_topics, on_route, send_pairs, shadow_only
from support.kafka import consume_n
from support.otlp import Receiver
from support.scripted_llm import ScriptedLLM
from support.workers import start_worker

pytestmark = [pytest.mark.timeout(240)]

ROUTE = "cs-agent/int4"


@pytest.fixture(autouse=True)
def no_process_telemetry(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Each test starts with the process's telemetry unresolved and no OTel environment."""
    for name in (*otel.ENDPOINT_ENVS, "OTEL_SDK_DISABLED", otel.SAMPLE_ENV):
        monkeypatch.delenv(name, raising=False)
    otel.reset()
    yield
    otel.reset()


@dataclass
class Memory:
    logs: InMemoryLogRecordExporter = field(default_factory=InMemoryLogRecordExporter)
    spans: InMemorySpanExporter = field(default_factory=InMemorySpanExporter)

    def events(self, name: str) -> list[dict[str, Any]]:
        return [
            dict(r.log_record.attributes or {})
            for r in self.logs.get_finished_logs()
            if r.log_record.event_name == name
        ]


def in_memory(sample: float = 1.0) -> Memory:
    memory = Memory()
    otel.install(otel.build(memory.logs, memory.spans, sample=sample, batch=False))
    return memory


def score(i: int, ok: bool = True, kind: str = "shadow") -> ScoreEvent:
    return ScoreEvent(
        pair_id=f"pair-{i}",
        route=ROUTE,
        kind=kind,  # type: ignore[arg-type]
        ts=float(i),
        decoding="greedy",
        metrics=Metrics(cosine=0.97 if ok else 0.31),
        verdict="ok" if ok else "drift",
        reasons=[] if ok else ["cosine 0.310 < 0.88"],
    )


def test_off_by_default() -> None:
    assert otel.current() is None
    otel.judged([score(1)], [])  # a hook with telemetry off does nothing, raises nothing
    assert otel.from_env({"OTEL_SERVICE_NAME": "x"}) is None
    disabled = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_SDK_DISABLED": "true"}
    assert otel.from_env(disabled) is None
    with pytest.raises(Exception, match="between 0 and 1"):
        otel.from_env({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", otel.SAMPLE_ENV: "2"})


POLICY = RoutePolicy(rules=("consecutive",), consecutive_failures=3, min_pairs=3)


async def test_a_route_without_its_floor_says_so_once(redis_store: RedisBreakerStore) -> None:
    """Default policy, no floor: every event names the missing floor, and the one
    "not armed" alert becomes one event."""
    memory = in_memory()
    policy = RoutePolicy(min_pairs=3, unarmed_alert_pairs=4)
    scores = [score(i) for i in range(1, 9)]
    results = await redis_store.fold_batch(scores, lambda _: policy, time.time())
    otel.judged(scores, results)
    events = memory.events(otel.EVALUATION_EVENT)
    assert len(events) == 8 and not any(e["quantdrift.route.armed"] for e in events)
    assert events[-1]["quantdrift.route.missing"][0].startswith(
        "tolerance:dissimilarity: no blessing: 0 greedy noise pairs"
    )
    (alert,) = memory.events(otel.NOT_ARMED_EVENT)
    assert alert["quantdrift.route"] == ROUTE and alert["quantdrift.alert.severity"] == "P2"


async def test_one_event_per_judged_pair_and_per_transition(redis_store: RedisBreakerStore) -> None:
    memory = in_memory()
    scores = [score(1), score(2), score(3, ok=False), score(4, ok=False), score(5, ok=False)]
    scores.append(score(6, kind="noise"))  # the floor's pairs evaluate no response
    results = await redis_store.fold_batch(scores, lambda _: POLICY, time.time())
    otel.judged(scores, results)

    events = memory.events(otel.EVALUATION_EVENT)
    assert [e["quantdrift.pair_id"] for e in events] == [f"pair-{i}" for i in range(1, 6)]
    assert events[0]["gen_ai.evaluation.name"] == "quantdrift.shadow_pair"
    assert events[0]["gen_ai.evaluation.score.value"] == pytest.approx(0.97)
    assert events[0]["gen_ai.evaluation.score.label"] == "ok"
    assert events[4]["gen_ai.evaluation.score.label"] == "drift"
    assert events[4]["gen_ai.evaluation.explanation"] == "cosine 0.310 < 0.88"
    # Armed from min_pairs on: the consecutive rule is all this policy relies on.
    assert [e["quantdrift.route.armed"] for e in events] == [False, False, True, True, False]
    transitions = memory.events(otel.TRANSITION_EVENT)
    assert len(transitions) == 1
    assert transitions[0]["quantdrift.breaker.rule"] == "consecutive"
    assert transitions[0]["quantdrift.breaker.to_state"] == "open"
    state, _ = await redis_store.read(ROUTE)
    assert transitions[0]["quantdrift.breaker.epoch"] == state.epoch

    # A redelivered batch folds as duplicates: no second event for any pair.
    again = await redis_store.fold_batch(scores, lambda _: POLICY, time.time())
    otel.judged(scores, again)
    assert len(memory.events(otel.EVALUATION_EVENT)) == 5
    assert len(memory.events(otel.TRANSITION_EVENT)) == 1


async def test_sampling_is_by_pair_id(redis_store: RedisBreakerStore) -> None:
    memory = in_memory(sample=0.5)
    scores = [score(i) for i in range(200)]
    results = await redis_store.fold_batch(scores, lambda _: POLICY, time.time())
    otel.judged(scores, results)
    got = {e["quantdrift.pair_id"] for e in memory.events(otel.EVALUATION_EVENT)}
    assert got == {s.pair_id for s in scores if otel.sampled(s.pair_id, 0.5)}
    assert 70 <= len(got) <= 130


async def test_a_failing_exporter_never_reaches_the_caller(redis_store: RedisBreakerStore) -> None:
    class Broken:
        def emit(self, **_: Any) -> None:
            raise RuntimeError("collector down")

    otel.install(otel.Telemetry(logger=Broken(), tracer=None))
    scores = [score(1)]
    results = await redis_store.fold_batch(scores, lambda _: POLICY, time.time())
    otel.judged(scores, results)  # logged, not raised


async def test_gateway_span_joins_the_pair_on_the_broker(stack: EmbeddedStack) -> None:
    """The span's attributes are the gateway's own logic: the scripted model and the
    gateway both run in this process (no server), the pair goes to the real broker."""
    memory = in_memory()
    llm = ScriptedLLM()
    topics = TopicNames(pairs=f"otel-{uuid.uuid4().hex[:8]}.pairs")
    kafka = KafkaSettings(bootstrap_servers=stack.bootstrap, partitions=1, topics=topics)
    await create_topics(stack.bootstrap, [topics.pairs])
    config = parse_config(
        {
            "precisions": {tag: [f"{llm.url}/{tag}"] for tag in ("int4", "bf16")},
            "routes": {ROUTE: {"candidate": "int4", "reference": "bf16"}},
            "shadow_sample_rate": 1.0,
        }
    )
    upstream = in_memory_upstream({llm.url: llm.app})
    gateway = Gateway(config, publisher=ShadowPublisher(kafka, 1.0), transport=upstream)
    async with in_process(gateway) as http:
        base = str(http.base_url).rstrip("/")
        client = openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="k", http_client=http)
        reply = await client.chat.completions.create(
            model=ROUTE,
            messages=[{"role": "user", "content": "What is the capital of France?"}],
            temperature=0,
        )
        pairs = await consume_n(stack.bootstrap, topics.pairs, 1, timeout=20)
    pair = PairEvent.parse(pairs[0].value)
    spans = memory.spans.get_finished_spans()
    assert len(spans) == 1, [s.name for s in spans]
    span = spans[0]
    attrs = dict(span.attributes or {})
    assert span.name == f"chat {ROUTE}"
    assert attrs["gen_ai.operation.name"] == "chat"
    assert attrs["gen_ai.response.id"] == reply.id
    assert attrs["gen_ai.response.model"] == reply.model == "m-int4"
    assert attrs["gen_ai.usage.output_tokens"] == reply.usage.completion_tokens  # type: ignore[union-attr]
    assert attrs["gen_ai.response.finish_reasons"] == ("stop",)
    assert attrs["quantdrift.pair_id"] == pair.pair_id
    assert span.end_time > span.start_time


async def test_worker_exports_evaluations_over_otlp_http(
    stack: EmbeddedStack,
    redis_prefix: str,
    receiver: Receiver,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.url)
    monkeypatch.setenv("OTEL_SERVICE_NAME", "quantdrift-worker-test")
    monkeypatch.setenv("OTEL_BLRP_SCHEDULE_DELAY", "100")  # batch every 0.1 s, not 1 s
    monkeypatch.setenv("QUANTDRIFT_EMBEDDING__TIER", "static")  # no model load: fast start
    settings = isolated_settings(stack, redis_prefix)
    await make_topics(settings)
    worker = start_worker(settings, stack.redis_url)
    try:
        route = "otel/int4"
        # The plumbing policy: three failing pairs in a row trip, after min_pairs (20).
        pairs = on_route(shadow_only(synthetic.healthy(route, seed=3), 18), route, "h")
        pairs += on_route(shadow_only(synthetic.drifted(route, seed=4), 6), route, "d")
        await send_pairs(
            settings.kafka.bootstrap_servers,
            settings.kafka.topics.pairs,
            [(route.encode(), p.dumps()) for p in pairs],
        )
        deadline = time.monotonic() + 120
        want = {p.pair_id for p in pairs}
        while True:
            seen = {
                e["attributes"].get("quantdrift.pair_id")
                for e in receiver.events(otel.EVALUATION_EVENT)
            }
            if want <= seen and receiver.events(otel.TRANSITION_EVENT):
                break
            assert worker.alive(), worker.log_tail()
            assert time.monotonic() < deadline, (
                f"{len(seen & want)}/{len(want)} evaluation events, "
                f"{len(receiver.events(otel.TRANSITION_EVENT))} transitions; "
                f"{receiver.requests} export requests\n{worker.log_tail()}"
            )
            await asyncio.sleep(0.2)
    finally:
        worker.stop()
    evaluations = receiver.events(otel.EVALUATION_EVENT)
    assert len(evaluations) == len(pairs), "one event per judged pair, no more"
    first = evaluations[0]
    assert first["resource"]["service.name"] == "quantdrift-worker-test"
    assert first["scope"] == "quantdrift"
    assert first["attributes"]["gen_ai.evaluation.name"] == "quantdrift.shadow_pair"
    assert first["attributes"]["quantdrift.route"] == route
    labels = {e["attributes"]["gen_ai.evaluation.score.label"] for e in evaluations}
    assert "ok" in labels and labels - {"ok"}, labels
    assert all(
        isinstance(e["attributes"].get("gen_ai.evaluation.score.value"), float) for e in evaluations
    )
    transition = receiver.events(otel.TRANSITION_EVENT)[0]
    assert transition["attributes"]["quantdrift.breaker.to_state"] == "open"
    assert transition["attributes"]["quantdrift.breaker.rule"] == "consecutive"
    assert route in transition["body"]


def test_a_console_rollback_is_an_event_too(
    stack: EmbeddedStack, redis_prefix: str, receiver: Receiver
) -> None:
    """``quantdrift route rollback`` exports its transition before the process exits."""
    env = {
        **os.environ,
        "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src"),
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,
        "QUANTDRIFT_REDIS__URL": stack.redis_url,
        "QUANTDRIFT_REDIS__KEY_PREFIX": redis_prefix,
        "QUANTDRIFT_KAFKA__BOOTSTRAP_SERVERS": stack.bootstrap,
        "QUANTDRIFT_KAFKA__TOPICS__CONTROL": f"otel-{uuid.uuid4().hex[:8]}.control",
        "QUANTDRIFT_KAFKA__TOPICS__ALERTS": f"otel-{uuid.uuid4().hex[:8]}.alerts",
        "QUANTDRIFT_SIGNING__KEYS": '{"ops": "console-otel-test-key-at-least-32-bytes"}',
        "QUANTDRIFT_SIGNING__ACTIVE_KEY_ID": "ops",
    }
    ran = subprocess.run(
        [sys.executable, "-m", "quantdrift", "route", "rollback", "--route", ROUTE],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr
    transitions = receiver.events(otel.TRANSITION_EVENT)
    assert len(transitions) == 1, ran.stderr
    attrs = transitions[0]["attributes"]
    assert (attrs["quantdrift.route"], attrs["quantdrift.breaker.rule"]) == (ROUTE, "manual")
    assert attrs["quantdrift.breaker.locked"] is True
