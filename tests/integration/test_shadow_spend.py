"""Shadow spend, metered apart from user traffic, through the real gateway.

The gateway runs with its own app, the embedded broker and a scripted upstream that
reports usage the way vLLM and ``lab serve`` do (``stream_options.include_usage`` on
chat streams, ``usage`` on ``/v1/score``). What the gateway says it spent
(``/metrics`` and ``/health``) is checked against the calls the upstream itself
recorded for this test's requests, counted apart from the code under test.
"""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from quantdrift.config import KafkaSettings
from quantdrift.gateway.http.service import Gateway
from quantdrift.gateway.shadow.publisher import ShadowPublisher
from quantdrift.stack import EmbeddedStack
from support.gateway_upstream import (
    GOOD,
    ROOMY,
    ROUTE,
    Scripted,
    chat_body,
    make_config,
    serving,
    shadow_pairs,
)
from support.kafka import unique_topic

pytestmark = [pytest.mark.timeout(120)]

REQUESTS = 3
PROMPT_TOKENS = 7  # what the scripted chat reports per call
SCORE_PROMPT_TOKENS = 5  # and per /v1/score call, before the answer's words


def samples(text: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """Every sample of ``name`` in a /metrics page, by its labels."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name:
                out[tuple(sorted(s.labels.items()))] = s.value
    return out


def value(text: str, name: str, **labels: str) -> float:
    return sum(
        v for k, v in samples(text, name).items() if all((a, b) in k for a, b in labels.items())
    )


def mine(scripted: Scripted, tag: str, marker: str) -> list[dict[str, Any]]:
    """The calls to ``tag`` whose chat carries this test's marker."""
    return [b for b in scripted.calls_to(tag) if marker in str(b.get("messages"))]


async def test_reference_spend_is_metered_per_route_and_purpose_apart_from_users(
    scripted: Scripted, stack: EmbeddedStack
) -> None:
    topic = unique_topic("pairs")
    publisher = ShadowPublisher(KafkaSettings(bootstrap_servers=stack.bootstrap), 1.0, topic=topic)
    config = make_config(
        scripted, GOOD, shadow_sample_rate=1.0, noise_sample_rate=1.0, teacher_forced=True,
        pools={"bf16": {"teacher_forcing": "lab"}}, timeouts=ROOMY,
    )  # fmt: skip
    gw = Gateway(config, publisher=publisher)
    marker = "spend-7f3a"
    async with serving(gw) as client:
        for i in range(REQUESTS):
            resp = await client.post("/v1/chat/completions", json=chat_body(f"{marker} {i}"))
            assert resp.status_code == 200 and resp.headers["x-quantdrift-precision"] == "int4"
        await shadow_pairs(gw, publisher, stack.bootstrap, topic, 2 * REQUESTS)
        metrics = (await client.get("/metrics")).text
        health = (await client.get("/health")).json()

    # What the upstream saw, counted apart: per request the user's int4 call, two
    # reference runs (the shadow pair's, reused by the noise pair, and the noise pair's
    # second) and one forced pass on the reference.
    assert len(mine(scripted, "int4", marker)) == REQUESTS
    ref_runs = mine(scripted, "bf16", marker)
    forced = mine(scripted, "bf16/score", marker)
    assert len(ref_runs) == 2 * REQUESTS and len(forced) == REQUESTS
    assert all(b.get("stream_options", {}).get("include_usage") for b in ref_runs)
    answer = "Hello from bf16, the answer is forty two."
    answer_tokens = len(range(0, len(answer), 4))  # the scripted stream's pieces
    forced_tokens = sum(SCORE_PROMPT_TOKENS + len(b["continuation"].split()) for b in forced)

    spent = "quantdrift_gateway_shadow_spend_"
    for purpose, calls in (("shadow", REQUESTS), ("noise", REQUESTS)):
        at = {"route": ROUTE, "side": "reference", "purpose": purpose}
        assert value(metrics, spent + "calls_total", **at) == calls
        assert value(metrics, spent + "tokens_total", **at, type="prompt") == calls * PROMPT_TOKENS
        assert value(metrics, spent + "tokens_total", **at, type="completion") == (
            calls * answer_tokens
        )
        assert value(metrics, spent + "seconds_total", **at) > 0
        assert value(metrics, spent + "unmetered_total", **at) == 0
    at = {"route": ROUTE, "side": "reference", "purpose": "teacher_forcing"}
    assert value(metrics, spent + "calls_total", **at) == REQUESTS
    assert value(metrics, spent + "tokens_total", **at, type="prompt") == forced_tokens
    assert value(metrics, spent + "tokens_total", **at, type="completion") == REQUESTS
    assert value(metrics, spent + "seconds_total", **at) > 0
    # Nothing spent on the candidate's side (the user's answer was the pair's), and the
    # users' counter holds only what users were served: int4, never the shadow's bf16.
    assert value(metrics, spent + "calls_total", side="candidate") == 0
    served = "quantdrift_gateway_completion_tokens_total"
    assert value(metrics, served, route=ROUTE, precision="bf16") == 0
    assert value(metrics, served, route=ROUTE, precision="int4") > 0

    view = health["routes"][ROUTE]["shadow_spend"]["reference"]
    assert view["shadow"]["calls"] == REQUESTS
    assert view["noise"]["completion_tokens"] == REQUESTS * answer_tokens
    assert view["teacher_forcing"]["prompt_tokens"] == forced_tokens
    assert view["teacher_forcing"]["seconds"] > 0


async def test_calls_without_usage_are_counted_unmetered(scripted: Scripted) -> None:
    # A reference pool that does not honour include_usage: its calls and seconds are
    # still counted, and each one says its tokens are unknown.
    config = make_config(
        scripted, GOOD, shadow_sample_rate=1.0, pools={"bf16": {"stream_usage": False}},
        timeouts=ROOMY,
    )  # fmt: skip
    gw = Gateway(config)  # no publisher: the pairs are counted no_publisher, spend is not
    marker = "unmetered-41c2"
    async with serving(gw) as client:
        for i in range(2):
            resp = await client.post("/v1/chat/completions", json=chat_body(f"{marker} {i}"))
            assert resp.status_code == 200
        assert await gw.shadow.wait_idle(20)
        metrics = (await client.get("/metrics")).text
    runs = mine(scripted, "bf16", marker)
    assert len(runs) == 2 and not any("stream_options" in b for b in runs)
    at = {"route": ROUTE, "side": "reference", "purpose": "shadow"}
    spent = "quantdrift_gateway_shadow_spend_"
    assert value(metrics, spent + "calls_total", **at) == 2
    assert value(metrics, spent + "unmetered_total", **at) == 2
    assert value(metrics, spent + "tokens_total", **at) == 0
    assert value(metrics, spent + "seconds_total", **at) > 0
