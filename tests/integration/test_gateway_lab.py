"""End to end with real upstreams: `quantdrift lab serve` processes (SmolLM2 int4 and the
f32 reference) behind the gateway, the real broker for the pairs. Slow: loads the model two or
three times. Also: the openai SDK's `n` and `include_usage` through the gateway on a real model,
and a reference killed mid-run, which must change nothing for users.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from quantdrift.config import KafkaSettings
from quantdrift.gateway.gateway_config import parse_config
from quantdrift.gateway.http.service import Gateway
from quantdrift.gateway.shadow.publisher import ShadowPublisher
from quantdrift.schemas import PairEvent
from quantdrift.stack import EmbeddedStack
from quantdrift.stack.ports import stop_popen
from support.divergence import forced_view_holds
from support.gateway_upstream import chat_body, content, serving
from support.kafka import consume_n, unique_topic
from support.lab import start_lab

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    pytest.importorskip("transformers")
    procs, urls = start_lab({"int4": "int4-g64", "bf16": "ref-f32"}, tmp_path_factory.mktemp("lab"))
    try:
        yield urls
    finally:
        for p in procs:
            stop_popen(p, timeout=10)


async def test_real_precisions_shadow_pairs_and_json(lab: dict[str, str], stack: EmbeddedStack):
    topic = unique_topic("pairs")
    publisher = ShadowPublisher(KafkaSettings(bootstrap_servers=stack.bootstrap), 1.0, topic=topic)
    config = parse_config(
        {
            "precisions": {"int4": [lab["int4"]], "bf16": [lab["bf16"]]},
            "routes": {
                "lab/int4": {"candidate": "int4", "reference": "bf16", "teacher_forced": True}
            },
            "shadow_sample_rate": 1.0,
            "timeouts": {"connect_s": 2, "read_s": 120, "total_s": 300, "shadow_total_s": 300},
        }
    )
    gw = Gateway(config, publisher=publisher)
    async with serving(gw) as client:
        client.timeout = httpx.Timeout(300)
        resp = await client.post(
            "/v1/chat/completions",
            json=chat_body("What is the capital of France?", max_tokens=24, temperature=0),
        )
        assert resp.status_code == 200 and content(resp)
        served = resp.headers["x-quantdrift-precision"]
        records = await consume_n(stack.bootstrap, topic, 1, timeout=240)
        pair = PairEvent.parse(records[0].value)
        assert (pair.candidate.precision, pair.reference.precision) == ("int4", "bf16")
        assert pair.candidate.text and pair.reference.text
        assert pair.candidate.top_logprobs and pair.reference_logprobs_on_candidate
        first = forced_view_holds(pair)
        body = chat_body(
            'Reply with only a JSON object with keys "city" and "country" for Paris.',
            max_tokens=48,
            temperature=0,
            expected_keys=["city", "country"],
        )
        jresp = await client.post("/v1/chat/completions", json=body)
        assert jresp.status_code == 200
        await gw.wait_shadows(240)
    print(f"\nlab: the first divergent token of the int4 answer: {first}")
    print(
        f"\nlab: served by {served}; JSON request served by "
        f"{jresp.headers['x-quantdrift-precision']}, fallbacks "
        f"{jresp.headers.get('x-quantdrift-fallbacks', '-')}: {json.dumps(content(jresp))[:120]}"
    )


async def test_sdk_n_and_usage_on_a_real_model(lab: dict[str, str]) -> None:
    openai = pytest.importorskip("openai")
    config = parse_config(
        {
            "precisions": {"int4": [lab["int4"]], "bf16": [lab["bf16"]]},
            "routes": {"lab/int4": {"candidate": "int4", "reference": "bf16"}},
            "shadow_sample_rate": 0.0,
            "stream_holdback_tokens": 4,
            "timeouts": {"connect_s": 2, "read_s": 120, "total_s": 300},
        }
    )
    async with serving(Gateway(config)) as http:
        client = openai.AsyncOpenAI(
            base_url=f"{str(http.base_url).rstrip('/')}/v1", api_key="-", max_retries=0,
            timeout=300,
        )  # fmt: skip
        messages = [{"role": "user", "content": "Name a colour."}]
        reply = await client.chat.completions.create(
            model="lab/int4", messages=messages, n=2, max_tokens=6, temperature=0.8, seed=1
        )
        assert [c.index for c in reply.choices] == [0, 1]
        assert reply.usage is not None and reply.usage.completion_tokens >= 2
        stream = await client.chat.completions.create(
            model="lab/int4", messages=messages, n=2, max_tokens=6, temperature=0.8, seed=1,
            stream=True, stream_options={"include_usage": True},
        )  # fmt: skip
        texts: dict[int, str] = {}
        last = None
        async for chunk in stream:
            last = chunk
            for c in chunk.choices:
                texts[c.index] = texts.get(c.index, "") + (c.delta.content or "")
        assert sorted(texts) == [0, 1] and all(texts.values())
        assert last is not None and last.choices == [] and last.usage.completion_tokens >= 2
        await client.close()


async def test_a_reference_killed_mid_run_changes_nothing_for_users(
    lab: dict[str, str], tmp_path: Path
) -> None:
    """Shadowing at 100 % to a reference of its own, SIGKILLed after the third request."""

    class Pairs:
        def __init__(self) -> None:
            self.pairs: list[PairEvent] = []
            self.connected, self.queue_depth = True, 0
            self.stats = type("S", (), {"offered": 0, "sent": 0, "dropped": {}})()

        async def start(self) -> None: ...

        async def stop(self, timeout: float = 5.0) -> None: ...

        def offer(self, pair: PairEvent) -> bool:
            self.pairs.append(pair)
            return True

    procs, ref = start_lab({"bf16": "ref-f32"}, tmp_path)
    victim = procs[0]
    publisher = Pairs()
    config = parse_config(
        {
            "precisions": {"int4": [lab["int4"]], "bf16": [ref["bf16"]]},
            "routes": {"lab/int4": {"candidate": "int4", "reference": "bf16"}},
            "shadow_sample_rate": 1.0,
            "timeouts": {"connect_s": 1, "read_s": 60, "total_s": 120, "shadow_total_s": 30},
        }
    )
    gw = Gateway(config, publisher=publisher)  # type: ignore[arg-type]
    latencies: list[tuple[bool, float]] = []
    try:
        async with serving(gw) as client:
            client.timeout = httpx.Timeout(120)
            for i in range(8):
                if i == 3:
                    await gw.wait_shadows(120)  # pairs 0-2 made it
                    victim.kill()
                    victim.wait(10)
                t0 = time.perf_counter()
                resp = await client.post(
                    "/v1/chat/completions",
                    json=chat_body(f"Say a word about {i}.", max_tokens=8, temperature=0),
                )
                latencies.append((i >= 3, time.perf_counter() - t0))
                assert resp.status_code == 200, resp.text
                assert resp.headers["x-quantdrift-precision"] == "int4"
                assert "x-quantdrift-fallbacks" not in resp.headers
            await gw.wait_shadows(60)
            metrics = (await client.get("/metrics")).text
    finally:
        for p in procs:
            stop_popen(p, timeout=10)
    before = sorted(t for after, t in latencies if not after)
    after = sorted(t for after, t in latencies if after)
    print(
        f"\nreference killed: user p50 before {before[len(before) // 2] * 1000:.0f} ms, "
        f"after {after[len(after) // 2] * 1000:.0f} ms; pairs {len(publisher.pairs)}"
    )
    assert len(publisher.pairs) == 3
    assert (
        'quantdrift_gateway_shadow_errors_total{kind="shadow",reason="upstream_connect"' in metrics
    )
    # Users never waited on the dead reference: no request took the 1 s connect timeout on top.
    assert after[len(after) // 2] < before[len(before) // 2] * 1.5 + 0.5
