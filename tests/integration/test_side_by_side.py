"""Several candidate pools judged on one reference answer, through the real gateway.

A route declares extra candidates; for each sampled request the reference answers
once, every candidate is asked, and each publishes its own pair under its own route
id. What the upstream saw is counted by the scripted server itself, apart from the
code under test.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from quantdrift.config import KafkaSettings, Settings
from quantdrift.demo.workers import settings_env
from quantdrift.gateway.gateway_config import candidate_route, parse_config
from quantdrift.gateway.http.service import Gateway
from quantdrift.gateway.shadow.publisher import ShadowPublisher
from quantdrift.schemas import PairEvent
from quantdrift.stack import EmbeddedStack
from support.gateway_upstream import ROOMY, ROUTE, Scripted, chat_body, make_config, serving
from support.gateway_upstream import shadow_pairs as published
from support.guard import isolated_settings, make_topics, wait_until
from support.kafka import unique_topic
from support.redis_keys import forget_prefix
from support.scripted_llm import ScriptedLLM
from support.workers import start_worker

pytestmark = [pytest.mark.timeout(120)]

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


# -- the report, on verdicts a real worker reached -----------------------------------------

ANSWERS = [
    "The capital of France is Paris, a city on the Seine.",
    "Paris is the capital of France; the Seine runs through it.",
    "France's capital city is Paris, on the river Seine.",
    "The French capital is Paris, which lies on the Seine.",
]
LOOP = "I am sorry. " * 40
# Warm and arm sooner than the defaults (20 pairs, 10 floor pairs), as the armed e2e does.
POLICY = {"default": {"min_pairs": 5, "min_floor_pairs": 6}}
COSTS = {"int4": 1.0, "int8": 2.0, "int3": 0.5}


@pytest.fixture
def world(stack: EmbeddedStack, tmp_path: Path) -> Iterator[tuple[Settings, Any, ScriptedLLM]]:
    prefix = f"qdtest:{uuid.uuid4().hex}:"
    policy = tmp_path / "policy.yaml"
    policy.write_text(yaml.safe_dump(POLICY))
    settings = isolated_settings(stack, prefix)
    # The static tier: no transformer model loads, and pairs still carry a cosine.
    embedding = settings.embedding.model_copy(update={"tier": "static"})
    settings = settings.model_copy(update={"policy_file": policy, "embedding": embedding})
    asyncio.run(make_topics(settings))
    llm = ScriptedLLM().start()
    llm.texts.update({"int4": ANSWERS[0], "int8": ANSWERS[1], "int3": LOOP})
    llm.variants["bf16"] = ANSWERS  # a sampled reference: two runs differ, a floor forms
    worker = start_worker(settings, stack.redis_url)
    try:
        yield settings, worker, llm
    finally:
        worker.stop()
        llm.stop()
        forget_prefix(stack.redis_url, prefix)


def report(settings: Settings, config: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **settings_env(settings, settings.redis.url or "")}
    return subprocess.run(
        [sys.executable, "-m", "quantdrift", "shadow", "report", "--config", str(config),
         "--route", ROUTE, *extra],
        capture_output=True, text=True, env=env, timeout=60, check=False,
    )  # fmt: skip


@pytest.mark.timeout(240)
async def test_the_report_names_the_cheapest_build_that_passes(
    world: tuple[Settings, Any, ScriptedLLM], tmp_path: Path
) -> None:
    settings, worker, llm = world
    data = {
        "precisions": {p: [f"{llm.url}/{p}"] for p in ("int4", "int8", "int3", "bf16")},
        "precision_models": {p: f"m-{p}" for p in ("int4", "int8", "int3", "bf16")},
        "routes": {ROUTE: {"candidate": "int4", "reference": "bf16",
                           "extra_candidates": ["int8", "int3"]}},
        # Constant scripted log-probs would make an entropy floor that never varies.
        "pools": {p: {"logprobs": False, **({"cost": COSTS[p]} if p in COSTS else {})}
                  for p in ("int4", "int8", "int3", "bf16")},
        "shadow_sample_rate": 1.0,
        "noise_sample_rate": 1.0,
        "timeouts": ROOMY,
    }  # fmt: skip
    config_file = tmp_path / "gateway.yaml"
    config_file.write_text(yaml.safe_dump(data, sort_keys=False))
    before = report(settings, config_file, "--json")
    assert before.returncode == 1, before.stderr  # nothing judged yet: no build passes
    assert json.loads(before.stdout)["cheapest_passing"] is None

    publisher = ShadowPublisher(
        KafkaSettings(bootstrap_servers=settings.kafka.bootstrap_servers), 1.0,
        topic=settings.kafka.topics.pairs,
    )  # fmt: skip
    gw = Gateway(parse_config(data), publisher=publisher)
    requests = 8
    async with serving(gw) as client:
        for i in range(requests):
            body = chat_body(f"What is the capital of France? ({i})", temperature=0.7)
            resp = await client.post("/v1/chat/completions", json=body)
            assert resp.status_code == 200 and resp.headers["x-quantdrift-precision"] == "int4"
        # Per request: a shadow and a noise pair under each of the three route ids.
        topic = settings.kafka.topics.pairs
        await published(gw, publisher, settings.kafka.bootstrap_servers, topic, 6 * requests)

    def verdicts() -> dict[str, str]:
        done = report(settings, config_file, "--json")
        return {c["pool"]: c["verdict"] for c in json.loads(done.stdout)["candidates"]}

    wanted = {"int4": "pass", "int8": "pass", "int3": "fail"}
    wait_until(lambda: verdicts() == wanted, 120, f"verdicts {wanted}", worker)
    done = report(settings, config_file, "--json")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["cheapest_passing"] == "int4"  # int3 is cheaper, and fails
    assert [(c["pool"], c["verdict"], c["cost"]) for c in out["candidates"]] == [
        ("int4", "pass", 1.0), ("int8", "pass", 2.0), ("int3", "fail", 0.5),
    ]  # fmt: skip
    assert out["candidates"][0]["serves_users"] and not out["candidates"][1]["serves_users"]
    assert out["candidates"][2]["route"] == candidate_route(ROUTE, "int3")
    text = report(settings, config_file).stdout
    print(f"\n$ quantdrift shadow report --config gateway.yaml --route {ROUTE}\n{text}")
    assert text.startswith(f"{ROUTE}: cheapest passing build: int4 (cost 1)")
