"""Several candidate pools judged on one reference answer, through the real gateway.

A route declares extra candidates; for each sampled request the reference answers
once, every candidate is asked, and each publishes its own pair under its own route
id. What the upstream saw is counted by the scripted server itself, apart from the
code under test.
"""

from __future__ import annotations

from collections import defaultdict

import pytest

from quantdrift.config import KafkaSettings
from quantdrift.gateway.gateway_config import candidate_route
from quantdrift.gateway.publisher import ShadowPublisher
from quantdrift.gateway.service import Gateway
from quantdrift.schemas import PairEvent
from quantdrift.stack import EmbeddedStack
from support.gateway_upstream import ROOMY, ROUTE, Scripted, chat_body, make_config, serving
from support.gateway_upstream import shadow_pairs as published
from support.kafka import unique_topic

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

POOLS = {"int4": "good", "int8": "good", "int3": "loop", "bf16": "good"}
EXTRAS = ["int8", "int3"]


def mine(scripted: Scripted, tag: str, marker: str) -> list[dict]:
    return [b for b in scripted.calls_to(tag) if marker in str(b.get("messages"))]


async def test_one_reference_answer_judges_every_candidate_under_its_own_route(
    scripted: Scripted, stack: EmbeddedStack
) -> None:
    topic = unique_topic("pairs")
    publisher = ShadowPublisher(KafkaSettings(bootstrap_servers=stack.bootstrap), 1.0, topic=topic)
    config = make_config(
        scripted, POOLS, shadow_sample_rate=1.0, teacher_forced=True, extra_candidates=EXTRAS,
        pools={"bf16": {"teacher_forcing": "lab"}}, timeouts=ROOMY,
    )  # fmt: skip
    gw = Gateway(config, publisher=publisher)
    marker, requests = "side-by-side-5d1e", 2
    async with serving(gw) as client:
        for i in range(requests):
            resp = await client.post("/v1/chat/completions", json=chat_body(f"{marker} {i}"))
            assert resp.status_code == 200 and resp.headers["x-quantdrift-precision"] == "int4"
        records = await published(gw, publisher, stack.bootstrap, topic, 3 * requests)
        health = (await client.get("/health")).json()

    # The reference answered once per request; each candidate was asked once; the
    # reference teacher-forced each candidate's answer.
    assert len(mine(scripted, "bf16", marker)) == requests
    for pool in ("int4", *EXTRAS):
        assert len(mine(scripted, pool, marker)) == requests, pool
    assert len(mine(scripted, "bf16/score", marker)) == 3 * requests

    pairs = [PairEvent.parse(r.value) for r in records]
    by_request: dict[str, list[PairEvent]] = defaultdict(list)
    for p in pairs:
        by_request[p.pair_id.split(":")[0]].append(p)
    assert len(by_request) == requests
    for group in by_request.values():
        routes = {p.route: p for p in group}
        assert set(routes) == {ROUTE, *(candidate_route(ROUTE, x) for x in EXTRAS)}
        assert {p.candidate.precision for p in group} == {"int4", *EXTRAS}
        assert len({p.reference.text for p in group}) == 1  # one reference answer
        assert len({p.pair_id for p in group}) == 3
        assert all(p.reference_logprobs_on_candidate for p in group)
        looping = routes[candidate_route(ROUTE, "int3")].candidate.text
        assert looping.count("I am sorry.") > 10  # the int3 pool's own (looping) answer

    spend = health["routes"][ROUTE]["shadow_spend"]
    assert spend["reference"]["shadow"]["calls"] == requests
    assert spend["reference"]["teacher_forcing"]["calls"] == requests
    assert "candidate" not in spend  # the users' answers were the route's candidate side
    for pool in EXTRAS:
        extra = health["routes"][ROUTE]["extra_candidates"][pool]
        assert extra["route"] == candidate_route(ROUTE, pool)
        assert extra["shadow_spend"]["candidate"]["shadow"]["calls"] == requests
        assert extra["shadow_spend"]["reference"]["teacher_forcing"]["calls"] == requests
        assert "shadow" not in extra["shadow_spend"]["reference"]  # no second reference run
