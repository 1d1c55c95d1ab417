"""What the end-to-end tests through a real gateway share: the example config on
scripted upstreams, ``quantdrift gateway`` / ``verdict-api`` children, the CLI as a user
runs it, and an isolated worker's settings and environment on the embedded stack.

Everything is started the way an operator starts it (``python -m quantdrift ...``), so
what a test sees is what the CLI builds.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import yaml

from quantdrift.config import Settings
from quantdrift.demo.workers import WorkerProcess, settings_env
from quantdrift.stack import EmbeddedStack, free_port
from quantdrift.stack.ports import stop_popen
from support.cli import quantdrift
from support.guard import isolated_settings, make_topics
from support.redis_keys import forget_prefix
from support.scripted_llm import ScriptedLLM
from support.workers import start_worker

ROOT = Path(__file__).resolve().parents[2]


def example_config(llm: ScriptedLLM, salt: str, **changes: Any) -> dict[str, Any]:
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
    config["sample_salt"] = salt
    return {**config, **changes}


EXAMPLE_ROUTE = "cs-agent/int4"  # the example config's route


@dataclass
class Gateway:
    proc: subprocess.Popen[bytes]
    url: str
    log: Path

    def stop(self) -> None:
        stop_popen(self.proc, timeout=15)

    def health(self) -> dict[str, Any]:
        body: dict[str, Any] = httpx.get(self.url + "/health", timeout=5).json()
        return body


def chat_capital(gw: Gateway, n: int, first: int, **options: Any) -> None:
    """``n`` chat requests to the example config's route through the openai SDK, each a
    distinct prompt (numbered from ``first``), each served by the candidate (int4)."""
    client = openai.OpenAI(base_url=gw.url + "/v1", api_key="unused", max_retries=0)
    for i in range(first, first + n):
        reply = client.chat.completions.with_raw_response.create(
            model=EXAMPLE_ROUTE,
            messages=[{"role": "user", "content": f"What is the capital of France? ({i})"}],
            max_tokens=32,
            **options,
        )
        assert reply.headers["x-quantdrift-precision"] == "int4"
    client.close()


def shadow_idle(gw: Gateway, timeout: float = 30) -> None:
    """Until the gateway's shadow queue is empty and no job runs."""
    deadline = time.monotonic() + timeout
    while (h := gw.health())["shadow_in_flight"] or h["shadow_queue"]:
        assert time.monotonic() < deadline, h
        time.sleep(0.05)


def start_gateway(config: dict[str, Any], env: dict[str, str], workdir: Path, name: str) -> Gateway:
    """``quantdrift gateway --config`` on a free port, once it knows every route's command."""
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
    proc = quantdrift(*argv, cwd=workdir, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    print(f"\n$ quantdrift {' '.join(argv)}\n{proc.stdout}", end="")
    return proc.stdout


@contextmanager
def verdict_api(env: dict[str, str], workdir: Path, token: str) -> Iterator[str]:
    """``quantdrift verdict-api``, the process Argo Rollouts and Flagger ask: its base URL."""
    path = workdir / "token"
    path.write_text(token + "\n")
    port = free_port()
    log = workdir / "verdict-api.log"
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "quantdrift", "verdict-api", "--port", str(port)),
            *("--token-file", str(path), "--log-level", "warning"),
        ],
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        env=env,
        cwd=workdir,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        until_healthz(proc, base, log)
        yield base
    finally:
        stop_popen(proc, timeout=10)


def route_verdict(base: str, route: str, token: str) -> dict[str, Any]:
    """What the verdict API answers for ``route`` (GET with the bearer token; 200 asserted)."""
    reply = httpx.get(
        f"{base}/api/v1/routes/{route}/verdict",
        headers={"Authorization": f"Bearer {token}"},
        timeout=10,
    )
    assert reply.status_code == 200, reply.text
    body: dict[str, Any] = reply.json()
    return body


def until_healthz(
    proc: subprocess.Popen[bytes], base: str, log: Path, within_s: float = 60
) -> None:
    """Wait until the verdict API at ``base`` answers ``/healthz``; fail with its log if
    the process dies or the time runs out."""
    deadline = time.monotonic() + within_s
    while True:
        assert proc.poll() is None, log.read_text()
        try:
            if httpx.get(base + "/healthz", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, "verdict API did not come up: " + log.read_text()
        time.sleep(0.1)


@contextmanager
def isolated_world(
    stack: EmbeddedStack, workdir: Path, policy: dict[str, Any]
) -> Iterator[tuple[Settings, dict[str, str]]]:
    """Settings under a fresh Redis prefix with ``policy`` as the policy file and the
    static scorer tier (no transformer model, and pairs still carry a cosine), the
    topics made, and the environment a child process reads them from; the prefix's keys
    are removed afterwards."""
    prefix = f"qdtest:{uuid.uuid4().hex}:"
    path = workdir / "policy.yaml"
    path.write_text(yaml.safe_dump(policy))
    settings = isolated_settings(stack, prefix)
    embedding = settings.embedding.model_copy(update={"tier": "static"})
    settings = settings.model_copy(update={"policy_file": path, "embedding": embedding})
    asyncio.run(make_topics(settings))
    env = {
        **os.environ,
        **settings_env(settings, stack.redis_url),
        "OMP_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "HF_HUB_OFFLINE": "1",
    }
    try:
        yield settings, env
    finally:
        forget_prefix(stack.redis_url, prefix)


# Four ways to give one answer: a healthy route whose pairs differ as sampled answers do.
ANSWERS = [
    "The capital of France is Paris, a city on the Seine.",
    "Paris is the capital of France; the Seine runs through it.",
    "France's capital city is Paris, on the river Seine.",
    "The French capital is Paris, which lies on the Seine.",
]


def paraphrasing(llm: ScriptedLLM) -> None:
    """A ``scripted_world`` script: the candidate (int4) gives the first of ``ANSWERS``,
    the reference (bf16) one of them in turn."""
    llm.texts["int4"] = ANSWERS[0]
    llm.variants["bf16"] = ANSWERS


@contextmanager
def scripted_world(
    stack: EmbeddedStack,
    workdir: Path,
    policy: dict[str, Any],
    script: Callable[[ScriptedLLM], None],
    web_port: int | None = None,
) -> Iterator[tuple[Settings, WorkerProcess, dict[str, str], ScriptedLLM]]:
    """``isolated_world`` with a scripted LLM (``script`` sets its answers) and a real
    worker on those settings (``web_port``: its status page there); both stopped
    afterwards."""
    with isolated_world(stack, workdir, policy) as (settings, env):
        llm = ScriptedLLM().start()
        script(llm)
        worker = start_worker(settings, stack.redis_url, web_port=web_port)
        try:
            yield settings, worker, env, llm
        finally:
            worker.stop()
            llm.stop()
