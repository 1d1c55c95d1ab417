"""End to end with real upstreams: two `quantdrift lab serve` processes (SmolLM2 int4 and the
f32 reference) behind the gateway, the real broker for the pairs. Slow: loads the model twice.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from quantdrift.config import KafkaSettings
from quantdrift.gateway.app import Gateway
from quantdrift.gateway.gateway_config import parse_config
from quantdrift.gateway.publisher import ShadowPublisher
from quantdrift.schemas import PairEvent
from quantdrift.stack import EmbeddedStack, free_port
from quantdrift.stack.ports import stop_popen

try:
    from kafka_helpers import consume_n, unique_topic
    from test_gateway import chat_body, content, serving
except ImportError:
    from tests.integration.kafka_helpers import consume_n, unique_topic
    from tests.integration.test_gateway import chat_body, content, serving

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    pytest.importorskip("transformers")
    logs = tmp_path_factory.mktemp("lab")
    procs, urls = [], {}
    try:
        for name, variant in (("int4", "int4-g64"), ("bf16", "ref-f32")):
            port = free_port()
            log = (logs / f"{name}.log").open("wb")
            procs.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "quantdrift",
                        "lab",
                        "serve",
                        "--precision",
                        variant,
                        "--port",
                        str(port),
                        "--threads",
                        "1",
                    ],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )
            urls[name] = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 300
        for name, url in urls.items():
            while True:
                try:
                    if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                    tail = Path(logs / f"{name}.log").read_text()[-2000:]
                    pytest.fail(f"lab serve {name} did not come up:\n{tail}")
                time.sleep(0.5)
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
        body = chat_body(
            'Reply with only a JSON object with keys "city" and "country" for Paris.',
            max_tokens=48,
            temperature=0,
            expected_keys=["city", "country"],
        )
        jresp = await client.post("/v1/chat/completions", json=body)
        assert jresp.status_code == 200
        await gw.wait_shadows(240)
    print(
        f"\nlab: served by {served}; JSON request served by "
        f"{jresp.headers['x-quantdrift-precision']}, fallbacks "
        f"{jresp.headers.get('x-quantdrift-fallbacks', '-')}: {json.dumps(content(jresp))[:120]}"
    )
