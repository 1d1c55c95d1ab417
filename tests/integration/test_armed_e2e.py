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
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
import yaml

from quantdrift.config import Settings
from quantdrift.demo.workers import WorkerProcess, settings_env
from quantdrift.stack import EmbeddedStack, free_port
from quantdrift.stack.ports import stop_popen
from support.guard import isolated_settings, make_topics, records_for, until_seen
from support.scripted_llm import ScriptedLLM
from support.workers import start_worker

openai = pytest.importorskip("openai")

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

ROOT = Path(__file__).resolve().parents[2]
ROUTE = "cs-agent/int4"  # the example config's route
TOKEN = "armed-e2e-verdict-token"
ANSWERS = [
    "The capital of France is Paris, a city on the Seine.",
    "Paris is the capital of France; the Seine runs through it.",
    "France's capital city is Paris, on the river Seine.",
    "The French capital is Paris, which lies on the Seine.",
]
BROKEN = "Bananas ripen faster in a paper bag because they release ethylene gas."
SAMPLED, GREEDY = 7, 7  # requests of each phase
# The default rule (tolerance), warming, flooring and alerting sooner than the defaults
# (20, 10, 100): the alert comes on the second greedy pair.
FLOOR = 6
POLICY = {"default": {"min_pairs": 5, "min_floor_pairs": FLOOR, "unarmed_alert_pairs": 9}}


def example_config(llm: ScriptedLLM, **changes: Any) -> dict[str, Any]:
    """``examples/gateway.yaml`` with the scripted upstreams in its pools, every request
    shadowed, and ``changes`` on top."""
    config = yaml.safe_load((ROOT / "examples" / "gateway.yaml").read_text())
    config["precisions"] = {"int4": [f"{llm.url}/int4"], "bf16": [f"{llm.url}/bf16"]}
    config["precision_models"] = {"int4": "m-int4", "bf16": "m-bf16"}
    # The scripted servers' logprobs are constants, so they would make an entropy floor
    # that never varies: declare the pools without logprobs (the route then has no
    # entropy test to rely on, and route status says why).
    for pool in config["pools"].values():
        pool["logprobs"] = False
    config["shadow_sample_rate"] = 1.0
    config["sample_salt"] = "armed-e2e-sample-salt-0123456789"
    return {**config, **changes}


@dataclass
class Gateway:
    proc: subprocess.Popen[bytes]
    url: str
    log: Path

    def stop(self) -> None:
        stop_popen(self.proc, timeout=15)


def start_gateway(config: dict[str, Any], env: dict[str, str], workdir: Path, name: str) -> Gateway:
    path = workdir / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    port = free_port()
    log = workdir / f"{name}.log"
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "quantdrift", "gateway", "--config", str(path)),
            *("--port", str(port), "--log-level", "info"),
        ],
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        env=env,
        cwd=workdir,
    )
    gw = Gateway(proc, f"http://127.0.0.1:{port}", log)
    deadline = time.monotonic() + 60
    while True:
        assert proc.poll() is None, log.read_text()
        try:
            health = httpx.get(gw.url + "/health", timeout=1)
            if health.status_code == 200 and health.json()["control_known"]:
                return gw
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, "gateway not up:\n" + log.read_text()[-3000:]
        time.sleep(0.1)


def cli(env: dict[str, str], workdir: Path, *argv: str) -> str:
    """``quantdrift ...`` as a user runs it; its stdout, printed here too."""
    proc = subprocess.run(
        [sys.executable, "-m", "quantdrift", *argv],
        capture_output=True,
        text=True,
        env=env,
        cwd=workdir,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    print(f"\n$ quantdrift {' '.join(argv)}\n{proc.stdout}", end="")
    return proc.stdout


@pytest.fixture
def world(
    stack: EmbeddedStack, tmp_path: Path
) -> Iterator[tuple[Settings, WorkerProcess, dict[str, str], ScriptedLLM]]:
    prefix = f"qdtest:{uuid.uuid4().hex}:"
    policy = tmp_path / "policy.yaml"
    policy.write_text(yaml.safe_dump(POLICY))
    settings = isolated_settings(stack, prefix)
    # The static tier: the worker (and calibrate, which scores as it does) loads no
    # transformer model, and its pairs still carry a cosine (the dissimilarity test).
    embedding = settings.embedding.model_copy(update={"tier": "static"})
    settings = settings.model_copy(update={"policy_file": policy, "embedding": embedding})
    asyncio.run(make_topics(settings))
    env = {
        **os.environ,
        **settings_env(settings, stack.redis_url),
        "OMP_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "HF_HUB_OFFLINE": "1",
    }
    llm = ScriptedLLM().start()
    llm.texts["int4"] = ANSWERS[0]
    llm.variants["bf16"] = ANSWERS
    worker = start_worker(settings, stack.redis_url)
    try:
        yield settings, worker, env, llm
    finally:
        worker.stop()
        llm.stop()
        client = redis.Redis.from_url(stack.redis_url)
        keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
        if keys:
            client.delete(*keys)
        client.close()


@pytest.fixture
def verdict_api(world: Any, tmp_path: Path) -> Iterator[str]:
    """``quantdrift verdict-api``, the process Argo Rollouts and Flagger ask."""
    _, _, env, _ = world
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    port = free_port()
    log = tmp_path / "verdict-api.log"
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "quantdrift", "verdict-api", "--port", str(port)),
            *("--token-file", str(token), "--log-level", "warning"),
        ],
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        env=env,
        cwd=tmp_path,
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        assert proc.poll() is None, log.read_text()
        try:
            if httpx.get(base + "/healthz", timeout=1).status_code == 200:
                break
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(0.1)
    yield base
    stop_popen(proc, timeout=10)


def ask(base: str, show: bool = True) -> dict[str, Any]:
    reply = httpx.get(
        f"{base}/api/v1/routes/{ROUTE}/verdict",
        headers={"Authorization": f"Bearer {TOKEN}"},
        timeout=10,
    )
    assert reply.status_code == 200, reply.text
    body: dict[str, Any] = reply.json()
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
    world: Any, verdict_api: str, tmp_path: Path
) -> None:
    settings, worker, env, llm = world
    t0 = time.monotonic()
    config = example_config(
        llm,
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
