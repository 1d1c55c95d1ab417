""" "Armed" means armed, as a user meets it: OpenAI SDK -> ``quantdrift gateway`` (its
example config) -> scripted upstreams, a real worker, the embedded stack.

1. The route was never calibrated and the gateway makes no noise pairs
   (``noise_sample_rate: 0``, ``noise_fill`` off): after ``min_pairs`` shadow pairs
   ``quantdrift route status`` says *partly armed* and names the missing floor, the
   verdict API answers ``inconclusive`` (an Argo analysis pauses, Flagger does not
   promote), and after ``unarmed_alert_pairs`` exactly one P2 ``breaker.not_armed``
   alert reaches the alerts topic.
2. The gateway restarts with the example's noise settings (``noise_fill`` on, its cap
   raised to 1.0 here so the test stays short): the route's floor fills from its own
   noise pairs, and the same commands say *armed* and ``pass``.

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
# The default rule (tolerance), warming and alerting sooner than the defaults (20, 100).
POLICY = {"default": {"min_pairs": 5, "unarmed_alert_pairs": 8}}


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
    settings = isolated_settings(stack, prefix).model_copy(update={"policy_file": policy})
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


def ask(base: str) -> dict[str, Any]:
    reply = httpx.get(
        f"{base}/api/v1/routes/{ROUTE}/verdict",
        headers={"Authorization": f"Bearer {TOKEN}"},
        timeout=10,
    )
    assert reply.status_code == 200, reply.text
    body: dict[str, Any] = reply.json()
    shown = {k: body[k] for k in ("verdict", "reason", "armed", "readiness", "missing")}
    print(f"\n$ curl .../api/v1/routes/{ROUTE}/verdict\n{json.dumps(shown, indent=1)}")
    return body


def chat(gw: Gateway, n: int) -> None:
    client = openai.OpenAI(base_url=gw.url + "/v1", api_key="unused", max_retries=0)
    for i in range(n):
        reply = client.chat.completions.create(
            model=ROUTE,
            messages=[{"role": "user", "content": f"What is the capital of France? ({i})"}],
            temperature=0.7,
            max_tokens=32,
        )
        assert reply.choices[0].message.content == ANSWERS[0]


async def not_armed_alerts(settings: Settings) -> list[dict[str, Any]]:
    records = await records_for(
        settings.kafka.bootstrap_servers, settings.kafka.topics.alerts, ROUTE
    )
    alerts = [json.loads(r.value) for r in records]
    return [a for a in alerts if a["kind"] == "breaker.not_armed"]


def test_an_uncalibrated_route_is_partly_armed_until_its_floor_fills(
    world: Any, verdict_api: str, tmp_path: Path
) -> None:
    settings, worker, env, _ = world
    t0 = time.monotonic()
    # 1. No calibration, no noise pairs: the operator skipped both.
    quiet = example_config(_llm(world), noise_sample_rate=0.0, noise_fill={"max_rate": 0.0})
    gw = start_gateway(quiet, env, tmp_path, "gateway-quiet")
    try:
        chat(gw, 12)
        asyncio.run(until_seen(settings, ROUTE, 12, worker, timeout=90))
    finally:
        gw.stop()
    out = cli(env, tmp_path, "route", "status", "--route", ROUTE)
    assert "armed=no (partly armed: 12 shadow pairs; abstaining: " in out
    assert "tolerance:lexical        abstains  no floor: 0 of 10 sampled noise pairs" in out
    assert "tolerance:hard           can fire" in out
    assert "tolerance:entropy        abstains (not relied on)  no logprobs" in out
    (row,) = json.loads(cli(env, tmp_path, "route", "status", "--route", ROUTE, "--json"))
    assert (row["state"], row["armed"], row["readiness"]) == ("closed", False, "partly armed")
    assert any(m.startswith("tolerance:lexical: no floor: 0 of 10") for m in row["missing"])
    body = ask(verdict_api)
    assert (body["verdict"], body["armed"]) == ("inconclusive", False)
    assert body["reason"].startswith("partly armed: 12 shadow pairs; abstaining: ")
    (alert,) = asyncio.run(not_armed_alerts(settings))
    assert alert["severity"] == "P2" and alert["evidence"]["pairs_seen"] == 8
    assert "tolerance:lexical: no floor: 0 of 10 sampled noise pairs" in alert["summary"]
    assert "abstains on every pair until the floor is there" in worker.log_tail(20_000)

    # 2. The example's noise settings: noise_fill raises the share while the floor fills.
    filling = example_config(
        _llm(world), noise_fill={"max_rate": 1.0, "floor_pairs": 10, "refresh_s": 0.5}
    )
    gw = start_gateway(filling, env, tmp_path, "gateway-filling")
    try:
        health = httpx.get(gw.url + "/health", timeout=5).json()
        assert health["routes"][ROUTE]["noise_floor"]["filling"] is True, health
        chat(gw, 12)
        asyncio.run(until_seen(settings, ROUTE, 24, worker, timeout=90))
        deadline = time.monotonic() + 60
        while not (row := _status(env, tmp_path))["armed"]:
            assert time.monotonic() < deadline, row
            time.sleep(0.5)
    finally:
        gw.stop()
    out = cli(env, tmp_path, "route", "status", "--route", ROUTE)
    assert "armed=yes (closed and armed: 24 shadow pairs;" in out
    cli(env, tmp_path, "route", "status", "--route", ROUTE, "--json")
    body = ask(verdict_api)
    assert (body["verdict"], body["armed"], body["missing"]) == ("pass", True, [])
    assert len(asyncio.run(not_armed_alerts(settings))) == 1  # still the one alert
    print(f"\nwhole walk: {time.monotonic() - t0:.1f} s")


def _llm(world: Any) -> ScriptedLLM:
    llm: ScriptedLLM = world[3]
    return llm


def _status(env: dict[str, str], workdir: Path) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, "-m", "quantdrift", "route", "status", "--route", ROUTE, "--json"],
        capture_output=True,
        text=True,
        env=env,
        cwd=workdir,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    (row,) = json.loads(proc.stdout)
    return dict(row)
