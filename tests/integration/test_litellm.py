"""The guard inside a real LiteLLM proxy (``litellm --config ...``, pinned 1.100.5).

The proxy runs from its own virtualenv (``make litellm``: its pins of openai and
rich differ from the project's) in front of a scripted OpenAI-compatible upstream
with two models, the candidate ``m-int4`` (whose deployment mirrors to the
reference through ``silent_model``) and the reference ``m-bf16``. The callback is
configured the LiteLLM way (``litellm_settings: callbacks:``). Checked:

1. mirrored calls become PairEvents on the real broker (prompt hashed, logprobs
   kept), and a real worker judges them;
2. ``quantdrift route rollback`` makes the proxy serve the reference within the
   switch budget (1 s from the command's issue to the first answer from the
   reference), and ``route restore`` brings the candidate back;
3. a mirror that never arrives is counted and said;
4. a slice-scoped rollback (a route whose policy scopes rollbacks to the slice, its
   candidate stuttering on Chinese only): the worker rolls back ``language=zh`` alone,
   and the proxy sends Chinese calls to the reference and English ones to the candidate.
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
import openai
import pytest
import redis
import yaml

from quantdrift.config import Settings
from quantdrift.demo.workers import settings_env
from quantdrift.detectors.script import language_of
from quantdrift.schemas import PairEvent
from quantdrift.schemas.keys import command_key
from quantdrift.schemas.signing import unverified_command
from quantdrift.stack import EmbeddedStack, free_port
from quantdrift.stack.ports import stop_popen
from support.guard import isolated_settings, make_topics, until_seen
from support.kafka import consume_n
from support.redis_keys import forget_prefix
from support.scripted_llm import ScriptedLLM
from support.workers import start_worker

pytestmark = [pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]
LITELLM = ROOT / ".venv-litellm" / "bin" / "litellm"
ROUTE = "cs-agent/int4"
LOST = "lost-mirror/int4"
SLICED = "zh-agent/int4"  # its policy scopes rollbacks to the failing slice
ZH_STUTTER = "首都首都首都首都首都首都是巴黎，法国的首都位于塞纳河畔，是一座历史悠久的美丽城市。"
SWITCH_BUDGET_S = 1.0
KEYS = {"ops": "litellm-test-signing-key-at-least-32-bytes"}


@dataclass
class Proxy:
    url: str
    settings: Settings
    env: dict[str, str]
    log: Path
    proc: subprocess.Popen[bytes]

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key="sk-anything", max_retries=0)

    def console(self, action: str, route: str) -> subprocess.Popen[str]:
        """``quantdrift route ACTION --route R``, the operator's console, in the background."""
        return subprocess.Popen(
            [sys.executable, "-m", "quantdrift", "route", action, "--route", route],
            env=self.env,
            cwd=self.log.parent,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )


@pytest.fixture(scope="module")
def upstream() -> Iterator[ScriptedLLM]:
    llm = ScriptedLLM()
    llm.texts["int4"] = "The capital of France is Paris, on the river Seine."
    llm.texts["bf16"] = "The capital of France is Paris, a city on the Seine."
    llm.start()
    yield llm
    llm.stop()


@pytest.fixture(scope="module")
def proxy(
    stack: EmbeddedStack, upstream: ScriptedLLM, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Proxy]:
    """One proxy for the module (it takes ~20 s to start); the tests run in file order."""
    if not LITELLM.exists():
        pytest.fail(f"{LITELLM} is missing: `make litellm` builds the proxy's virtualenv")
    tmp_path = tmp_path_factory.mktemp("litellm")
    prefix = f"qdtest:{uuid.uuid4().hex}:"
    settings = isolated_settings(stack, prefix)
    asyncio.run(make_topics(settings))

    def deployment(group: str, tag: str, **extra: str) -> dict[str, object]:
        params = {"model": f"openai/m-{tag}", "api_base": upstream.base(tag), "api_key": "x"}
        return {"model_name": group, "litellm_params": {**params, **extra}}

    config = tmp_path / "litellm.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "model_list": [
                    deployment("cs-agent", "int4", silent_model="cs-agent-bf16"),
                    deployment("cs-agent-bf16", "bf16"),
                    # Its mirror names a group that does not exist: it never arrives.
                    deployment("lost", "int4", silent_model="no-such-group"),
                    deployment("lost-bf16", "bf16"),
                    deployment("zh-agent", "int4", silent_model="zh-agent-bf16"),
                    deployment("zh-agent-bf16", "bf16"),
                ],
                "litellm_settings": {"callbacks": "quantdrift.integrations.litellm.guard"},
            }
        )
    )
    routes = tmp_path / "quantdrift-routes.yaml"
    routes.write_text(
        yaml.safe_dump(
            {
                "mirror_timeout_s": 3,
                "routes": {
                    ROUTE: {
                        "candidate": "cs-agent",
                        "reference": "cs-agent-bf16",
                        "candidate_precision": "int4",
                        "reference_precision": "bf16",
                    },
                    LOST: {"candidate": "lost", "reference": "lost-bf16"},
                    SLICED: {"candidate": "zh-agent", "reference": "zh-agent-bf16"},
                },
            }
        )
    )
    env = {
        **os.environ,
        **settings_env(settings, stack.redis_url),
        "PYTHONPATH": str(ROOT / "src"),
        "QUANTDRIFT_LITELLM__CONFIG": str(routes),
        "QUANTDRIFT_SIGNING__KEYS": json.dumps(KEYS),
        "QUANTDRIFT_SIGNING__ACTIVE_KEY_ID": "ops",
        "QUANTDRIFT_PROMPT_SALT": "litellm-test-salt",
        "QUANTDRIFT_EMBEDDING__TIER": "static",
        "NO_PROXY": "127.0.0.1,localhost",
    }
    port = free_port()
    log = tmp_path / "litellm.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [str(LITELLM), "--config", str(config), "--host", "127.0.0.1", "--port", str(port)],
            env=env,
            cwd=tmp_path,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        assert proc.poll() is None, log.read_text()[-4000:]
        try:
            if httpx.get(f"{url}/health/liveliness", timeout=1).status_code == 200:
                break
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, "proxy did not come up:\n" + log.read_text()[-4000:]
        time.sleep(0.2)
    yield Proxy(url, settings, env, log, proc)
    stop_popen(proc, timeout=15)
    forget_prefix(stack.redis_url, prefix)


def ask(client: openai.OpenAI, model: str, text: str = "What is the capital of France?"):  # type: ignore[no-untyped-def]
    return client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": text}],
        temperature=0,
        logprobs=True,
        top_logprobs=3,
    )


def served_by(reply) -> str:  # type: ignore[no-untyped-def]
    """Which upstream model answered: the scripted upstream puts it in the response id."""
    return str(reply.id).split("-")[1]


async def test_mirrors_become_pairs_and_a_worker_judges_them(
    proxy: Proxy, upstream: ScriptedLLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = proxy.client()
    replies = [ask(client, "cs-agent", f"Question {i}: the capital of France?") for i in range(5)]
    assert {served_by(r) for r in replies} == {"int4"}
    records = await consume_n(
        proxy.settings.kafka.bootstrap_servers, proxy.settings.kafka.topics.pairs, 5, timeout=60
    )
    pairs = [PairEvent.parse(r.value) for r in records]
    assert {p.route for p in pairs} == {ROUTE}
    assert len({p.pair_id for p in pairs}) == 5
    for p in pairs:
        assert p.pair_id.startswith("litellm-") and p.kind == "shadow"
        assert (p.candidate.model, p.reference.model) == ("m-int4", "m-bf16")
        assert (p.candidate.precision, p.reference.precision) == ("int4", "bf16")
        assert p.candidate.text == upstream.texts["int4"]
        assert p.reference.text == upstream.texts["bf16"]
        assert p.request.prompt is None and p.request.prompt_hash, "salted hash by default"
        assert p.request.temperature == 0.0 and p.request.decoding == "greedy"
        assert p.candidate.token_logprobs and p.reference.token_logprobs
        assert p.candidate.top_logprobs is not None
    # Each mirror reached the reference model once, and nothing else did.
    assert len(upstream.calls_to("bf16")) == 5

    monkeypatch.setenv("QUANTDRIFT_EMBEDDING__TIER", "static")  # no model load: fast start
    worker = start_worker(proxy.settings)
    try:
        state = await until_seen(proxy.settings, ROUTE, 5, worker, timeout=120)
    finally:
        worker.stop()
    assert state.pairs_seen == 5


async def test_rollback_moves_the_proxy_to_the_reference_and_restore_brings_it_back(
    proxy: Proxy,
) -> None:
    client = proxy.client()
    assert served_by(ask(client, "cs-agent")) == "int4"
    await asyncio.sleep(1.0)  # the guard's controller has started and read the route key
    r = redis.Redis.from_url(proxy.settings.redis.url or "")
    key = command_key(proxy.settings.redis.key_prefix, ROUTE)
    latencies = {}
    try:
        for action, side in (("rollback", "bf16"), ("restore", "int4")):
            console = proxy.console(action, ROUTE)
            first_on_side = None
            deadline = time.monotonic() + 60
            while first_on_side is None:
                reply = ask(client, "cs-agent")
                if served_by(reply) == side:
                    first_on_side = time.time()
                assert time.monotonic() < deadline, f"{action}: the proxy never served {side}"
            out, _ = console.communicate(timeout=60)
            assert console.returncode == 0, out
            command = unverified_command(r.get(key))  # type: ignore[arg-type]
            assert command.action == action
            latencies[action] = first_on_side - command.issued_at
            # And it stays there.
            assert {served_by(ask(client, "cs-agent")) for _ in range(3)} == {side}
    finally:
        r.close()
    print(
        "\nLiteLLM switch latency (command issued -> first answer from the other side): "
        + ", ".join(f"{a} {v * 1000:.0f} ms" for a, v in latencies.items())
    )
    for action, latency in latencies.items():
        assert latency < SWITCH_BUDGET_S, f"{action}: {latency:.3f} s"


async def test_a_mirror_that_never_arrives_is_counted(proxy: Proxy) -> None:
    client = proxy.client()
    assert served_by(ask(client, "lost")) == "int4"  # the user's call is served regardless
    deadline = time.monotonic() + 30
    while "no silent_model mirror for call" not in proxy.log.read_text():
        assert time.monotonic() < deadline, proxy.log.read_text()[-3000:]
        await asyncio.sleep(0.2)
    assert "(1 missing so far)" in proxy.log.read_text()


async def test_a_slice_scoped_rollback_moves_only_that_slices_calls(
    proxy: Proxy, upstream: ScriptedLLM, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def chinese(body: dict[str, Any]) -> bool:
        return language_of(str(body["messages"][-1]["content"])) == "zh"

    upstream.answer["int4"] = lambda body: ZH_STUTTER if chinese(body) else None
    policy = tmp_path / "policy.yaml"
    scoped = {"rollback_scope": "slice", "slice_dimensions": ["language"], "min_pairs": 5,
              "slice_min_pairs": 5, "cooldown_s": 600}  # fmt: skip
    policy.write_text(yaml.safe_dump({"routes": {SLICED: scoped}}))
    monkeypatch.setenv("QUANTDRIFT_EMBEDDING__TIER", "static")
    # The breaker signs with the key the proxy's guard knows (as the console does).
    monkeypatch.setenv("QUANTDRIFT_SIGNING__KEYS", proxy.env["QUANTDRIFT_SIGNING__KEYS"])
    monkeypatch.setenv("QUANTDRIFT_SIGNING__ACTIVE_KEY_ID", "ops")
    worker = start_worker(proxy.settings.model_copy(update={"policy_file": policy}))
    client = proxy.client()
    r = redis.Redis.from_url(proxy.settings.redis.url or "")
    try:
        n = mirrored = 0
        while True:  # three English calls to one Chinese, until the slice rolls back
            for i in range(4):
                n += 1
                text = f"法国的首都是哪里？({n})" if i == 3 else f"What is the capital? ({n})"
                mirrored += served_by(ask(client, "zh-agent", text)) == "int4"  # and mirrored
            state = await until_seen(proxy.settings, SLICED, mirrored, worker, timeout=60)
            if state.held:
                break
            assert n < 200, "no slice rollback after 50 stuttered Chinese answers"
        assert list(state.held) == ["language=zh"] and state.state == "closed", state
        command = unverified_command(r.get(command_key(proxy.settings.redis.key_prefix, SLICED)))  # type: ignore[arg-type]
        assert command.slice is not None and command.slice.key == "language=zh"
        deadline = time.monotonic() + 10
        while served_by(ask(client, "zh-agent", "法国的首都是哪里？")) != "bf16":
            assert time.monotonic() < deadline, "the proxy never sent Chinese to the reference"
        latency = time.time() - command.issued_at
        replies = [ask(client, "zh-agent", t) for t in ("巴黎在哪里？", "Where is Paris?") * 2]
        assert [served_by(x) for x in replies] == ["bf16", "int4"] * 2
    finally:
        r.close()
        worker.stop()
        upstream.answer.pop("int4", None)
    print(f"\nLiteLLM slice rollback: issued -> Chinese on bf16 within {latency * 1000:.0f} ms")
