""" "Armed" means armed, as a user meets it: OpenAI SDK -> ``quantdrift gateway`` (its
example config) -> scripted upstreams, a real worker (the static scorer tier), the
embedded stack. One gateway, one walk:

1. Sampled traffic: the gateway's ``noise_fill`` (its cap raised to 1.0 here so the
   walk stays short) fills the route's sampled floor from its own noise pairs, and the
   route is armed.
2. Greedy traffic arrives: two greedy reference runs agree, so no noise floor can
   exist for it. ``quantdrift route status`` says *partly armed* and names the missing
   blessing, the verdict API answers ``inconclusive`` (an Argo analysis pauses, Flagger
   does not promote), and after ``unarmed_alert_pairs`` exactly one P2
   ``breaker.not_armed`` alert reaches the alerts topic.
3. ``quantdrift calibrate --topic --since T --route R --blessed-label int4`` blesses the
   build now serving from the route's own greedy shadow pairs, read from the live pairs
   topic where the gateway published them: the same commands say *armed* and ``pass``.
4. The candidate breaks (its upstream answers something else entirely): the route rolls
   back on a divergence test (``tolerance:lexical`` or ``:dissimilarity`` in the
   evidence), and the next SDK request is served by the reference.

The upstreams are scripted (``scripted_llm.py``): the reference answers in turn with
one of four paraphrases, as a model sampled at temperature 0.7 would, so two reference
runs differ and their noise pairs make a floor; the candidate answers the first. What
each command prints is printed here too (``-s``), as a user sees it.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from quantdrift.config import Settings
from quantdrift.demo.workers import WorkerProcess
from quantdrift.stack import EmbeddedStack
from support.e2e import (
    ANSWERS,
    Gateway,
    cli,
    example_config,
    paraphrasing,
    route_verdict,
    scripted_world,
    start_gateway,
    verdict_api,
)
from support.guard import records_for, until_seen
from support.scripted_llm import ScriptedLLM

openai = pytest.importorskip("openai")

pytestmark = [pytest.mark.timeout(240)]

ROUTE = "cs-agent/int4"  # the example config's route
TOKEN = "armed-e2e-verdict-token"
BROKEN = "Bananas ripen faster in a paper bag because they release ethylene gas."
SAMPLED, GREEDY = 7, 7  # requests of each phase
# The default rule (tolerance), warming, flooring and alerting sooner than the defaults
# (20, 10, 100): the alert comes on the second greedy pair.
FLOOR = 6
SALT = "armed-e2e-sample-salt-0123456789"
POLICY = {"default": {"min_pairs": 5, "min_floor_pairs": FLOOR, "unarmed_alert_pairs": 9}}


@pytest.fixture
def world(
    stack: EmbeddedStack, tmp_path: Path
) -> Iterator[tuple[Settings, WorkerProcess, dict[str, str], ScriptedLLM]]:
    with scripted_world(stack, tmp_path, POLICY, paraphrasing) as world:
        yield world


@pytest.fixture
def verdict_base(world: Any, tmp_path: Path) -> Iterator[str]:
    """``quantdrift verdict-api``, the process Argo Rollouts and Flagger ask."""
    with verdict_api(world[2], tmp_path, TOKEN) as base:
        yield base


def ask(base: str, show: bool = True) -> dict[str, Any]:
    body = route_verdict(base, ROUTE, TOKEN)
    if show:
        shown = {k: body[k] for k in ("verdict", "reason", "armed", "readiness", "missing")}
        print(f"\n$ curl .../api/v1/routes/{ROUTE}/verdict\n{json.dumps(shown, indent=1)}")
    return body


def until_verdict(base: str, verdict: str, timeout: float = 30) -> dict[str, Any]:
    """Ask the verdict API until it answers ``verdict`` (a condition, not a sleep)."""
    deadline = time.monotonic() + timeout
    while (body := ask(base, show=False))["verdict"] != verdict:
        assert time.monotonic() < deadline, body
        time.sleep(0.2)
    return ask(base)


@dataclass
class Reply:
    text: str
    precision: str


def chat(gw: Gateway, n: int, temperature: float, first: int = 0) -> list[Reply]:
    """``n`` requests through the openai SDK, each a distinct prompt."""
    client = openai.OpenAI(base_url=gw.url + "/v1", api_key="unused", max_retries=0)
    replies = []
    for i in range(first, first + n):
        raw = client.chat.completions.with_raw_response.create(
            model=ROUTE,
            messages=[{"role": "user", "content": f"What is the capital of France? ({i})"}],
            temperature=temperature,
            max_tokens=32,
        )
        reply = raw.parse()
        text = reply.choices[0].message.content or ""
        replies.append(Reply(text, raw.headers.get("x-quantdrift-precision", "")))
    client.close()
    return replies


async def alerts_on(settings: Settings) -> list[dict[str, Any]]:
    """The route's alerts, as on-call receives them from the alerts topic."""
    topic = settings.kafka.topics.alerts
    records = await records_for(settings.kafka.bootstrap_servers, topic, ROUTE, timeout=2.0)
    return [json.loads(r.value) for r in records]


def test_a_route_armed_from_its_own_pairs_catches_a_broken_candidate(
    world: Any, verdict_base: str, tmp_path: Path
) -> None:
    verdict_api = verdict_base
    settings, worker, env, llm = world
    t0 = time.monotonic()
    config = example_config(
        llm,
        SALT,
        noise_sample_rate=0.0,
        noise_fill={"max_rate": 1.0, "floor_pairs": FLOOR, "refresh_s": 0.5},
    )
    gw = start_gateway(config, env, tmp_path, "gateway")
    try:
        # 1. Sampled traffic: noise_fill makes the route's floor from its own noise pairs.
        health = httpx.get(gw.url + "/health", timeout=5).json()
        assert health["routes"][ROUTE]["noise_floor"]["filling"] is True, health
        assert {r.text for r in chat(gw, SAMPLED, temperature=0.7)} == {ANSWERS[0]}
        asyncio.run(until_seen(settings, ROUTE, SAMPLED, worker, timeout=60))
        body = until_verdict(verdict_api, "pass")
        assert (body["armed"], body["missing"]) == (True, [])

        print(f"\n[{time.monotonic() - t0:.1f} s] armed on sampled traffic")
        # 2. Greedy traffic: no noise floor can exist for it; nothing arms it yet.
        since = time.time()
        chat(gw, GREEDY, temperature=0.0, first=SAMPLED)
        asyncio.run(until_seen(settings, ROUTE, SAMPLED + GREEDY, worker, timeout=60))
        out = cli(env, tmp_path, "route", "status", "--route", ROUTE)
        assert f"armed=no (partly armed: {SAMPLED + GREEDY} shadow pairs; abstaining: " in out
        assert "tolerance:lexical        abstains  no blessing: 0 greedy noise pairs" in out
        assert "tolerance:hard           can fire" in out
        assert "tolerance:entropy        abstains (not relied on)  no logprobs" in out
        (row,) = json.loads(cli(env, tmp_path, "route", "status", "--route", ROUTE, "--json"))
        assert (row["state"], row["armed"], row["readiness"]) == ("closed", False, "partly armed")
        assert any(m.startswith("tolerance:lexical: no blessing: 0 greedy") for m in row["missing"])
        body = ask(verdict_api)
        assert (body["verdict"], body["armed"]) == ("inconclusive", False)
        assert body["reason"].startswith(f"partly armed: {SAMPLED + GREEDY} shadow pairs; ")
        assert "abstains on every pair until the floor is there" in worker.log_tail(20_000)

        print(f"\n[{time.monotonic() - t0:.1f} s] partly armed on greedy traffic")
        # 3. Bless the build now serving from the route's greedy pairs on the live topic.
        argv = ["calibrate", "--topic", "--since", f"{since:.3f}", "--route", ROUTE]
        out = cli(env, tmp_path, *argv, "--blessed-label", "int4", "--no-progress")
        assert out.startswith(f"{ROUTE} greedy: {GREEDY} pairs (") and out.count("\n") == 1
        assert f"{GREEDY} blessed pairs), floor now {GREEDY}" in out
        out = cli(env, tmp_path, "route", "status", "--route", ROUTE)
        assert f"armed=yes (closed and armed: {SAMPLED + GREEDY} shadow pairs;" in out
        body = ask(verdict_api)
        assert (body["verdict"], body["armed"], body["missing"]) == ("pass", True, [])

        print(f"\n[{time.monotonic() - t0:.1f} s] armed by calibrate --topic")
        # 4. The candidate breaks: a divergence test rolls the route back.
        llm.texts["int4"] = BROKEN
        n = SAMPLED + GREEDY
        while True:
            (reply,) = chat(gw, 1, temperature=0.0, first=n)
            assert (reply.text, reply.precision) == (BROKEN, "int4")
            n += 1
            state = asyncio.run(until_seen(settings, ROUTE, n, worker, timeout=30))
            if state.state != "closed":
                break
            assert n < SAMPLED + GREEDY + 30, "no rollback after 30 broken answers"
        print(f"\nrolled back after {n - SAMPLED - GREEDY} broken answers: {state.state}")
        deadline = time.monotonic() + 10
        while httpx.get(gw.url + "/health", timeout=5).json()["routes"][ROUTE]["serving"] != "bf16":
            assert time.monotonic() < deadline, "the gateway did not apply the rollback"
            time.sleep(0.05)
        (reply,) = chat(gw, 1, temperature=0.0, first=n)
        assert reply.precision == "bf16" and reply.text in ANSWERS, reply
    finally:
        gw.stop()
    alerts = asyncio.run(alerts_on(settings))
    (alert,) = [a for a in alerts if a["kind"] == "breaker.not_armed"]
    assert alert["severity"] == "P2" and alert["evidence"]["pairs_seen"] == 9
    assert "tolerance:lexical: no blessing" in alert["summary"], alert
    (opened,) = [a for a in alerts if a["kind"] == "breaker.open"]
    print(f"\nrollback alert: {opened['summary']}")
    assert opened["evidence"]["rule"] in ("tolerance:lexical", "tolerance:dissimilarity"), opened
    print(f"\nwhole walk: {time.monotonic() - t0:.1f} s")
