"""Hostile input, failed dependencies and shutdown, against a real ``quantdrift gateway``.

Each case runs against the CLI's gateway process (``python -m quantdrift gateway``)
in front of the scripted upstream on the wire (``support.gateway_upstream``, a thread
of this process, recording every call), with the session's
embedded broker for pairs. The promise under test: every malformed request gets
an OpenAI-shaped 4xx and no upstream call, nothing the caller typed reaches a
response header, user-controlled work is bounded (body size, nesting, regexes),
a restarted gateway that cannot know a route's state serves the reference, and
a stop drops shadow work only with a count and a log line.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
import psutil
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from quantdrift.schemas import CommandSigner, RouteCommand
from quantdrift.stack import EmbeddedStack, create_topics, free_port
from quantdrift.stack.ports import stop_popen
from support.gateway_upstream import Scripted
from support.kafka import consume_n, produce, unique_topic

pytestmark = [pytest.mark.timeout(240)]

ROUTE = "chat/int4"
SIGNING_KEY = "hostile-suite-signing-key-0123456789abcdef"
LIMITS = {"max_body_bytes": 1 << 20, "max_messages": 64, "max_total_tokens": 4096}


# -- the scripted upstream ---------------------------------------------------------------
# ``support.gateway_upstream.Scripted`` on the wire (the gateway runs as a process): mode
# ``evil`` answers plain text, or, asked for JSON, a value the ReDoS case's pattern
# backtracks on; mode ``never`` is a reference that hangs. Calls are recorded, so a test
# can prove a refused request never reached a model.


# -- the gateway process ---------------------------------------------------------------------


@dataclass
class GatewayProcess:
    port: int
    log: Path
    proc: subprocess.Popen[bytes]
    pairs_topic: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def tail(self, n: int = 4000) -> str:
        return self.log.read_bytes()[-n:].decode("utf-8", "replace")

    def wait_up(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                if httpx.get(f"{self.url}/health", timeout=1.0).status_code in (200, 401, 503):
                    return
            except httpx.HTTPError:
                pass
            assert self.proc.poll() is None, f"gateway exited:\n{self.tail()}"
            assert time.monotonic() < deadline, f"gateway not up:\n{self.tail()}"
            time.sleep(0.1)

    def rss_mb(self) -> float:
        return float(psutil.Process(self.proc.pid).memory_info().rss) / 2**20

    def stop(self) -> None:
        stop_popen(self.proc, timeout=15)


def gateway_config(up: Scripted, reference: str = "bf16", **extra: Any) -> dict[str, Any]:
    hangs = reference == "hang"
    return {
        "precisions": {
            "int4": [up.base("evil", "int4")],
            "bf16": [up.base("never" if hangs else "evil", reference)],
        },
        "routes": {ROUTE: {"candidate": "int4", "reference": "bf16"}},
        "default_route": ROUTE,
        "shadow_sample_rate": 1.0,
        "sample_salt": "hostile-suite-sample-salt-0123",
        "unknown_fields": "drop",
        "logprobs_on_user_calls": False,
        "timeouts": {"connect_s": 1, "read_s": 5, "total_s": 10, "shadow_total_s": 60},
        "limits": LIMITS,
        **extra,
    }


def launch(
    tmp_path: Path,
    name: str,
    config: dict[str, Any],
    env: dict[str, str],
    *,
    control: bool = False,
) -> GatewayProcess:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))  # precisions keep their order
    port = free_port()
    log = tmp_path / f"{name}.log"
    argv = [sys.executable, "-m", "quantdrift", "gateway", "--config", str(path)]
    argv += ["--port", str(port), "--log-level", "info"]
    if not control:
        argv.append("--no-control")
    full_env = {
        **os.environ,
        "QUANTDRIFT_SIGNING__KEYS": json.dumps({"drill": SIGNING_KEY}),
        "QUANTDRIFT_SIGNING__ACTIVE_KEY_ID": "drill",
        "OMP_NUM_THREADS": "1",
        **env,
    }
    proc = subprocess.Popen(
        argv, stdout=log.open("ab"), stderr=subprocess.STDOUT, env=full_env, cwd=tmp_path
    )
    return GatewayProcess(port, log, proc)


@pytest.fixture(scope="module")
def gateway(
    scripted: Scripted, stack: EmbeddedStack, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayProcess]:
    """One gateway for the request cases: open (no keys), every request shadowed."""
    topic = unique_topic("hostile-pairs")
    asyncio.run(create_topics(stack.bootstrap, [topic], partitions=1))
    env = {
        "QUANTDRIFT_KAFKA__BOOTSTRAP_SERVERS": stack.bootstrap,
        "QUANTDRIFT_KAFKA__TOPICS__PAIRS": topic,
    }
    gw = launch(tmp_path_factory.mktemp("hostile"), "gateway", gateway_config(scripted), env)
    gw.pairs_topic = topic
    try:
        gw.wait_up()
        yield gw
    finally:
        gw.stop()


def shadows_idle(gw: GatewayProcess, timeout: float = 20.0) -> dict[str, Any]:
    """Wait until the gateway's shadow queue is empty and no shadow job runs."""
    deadline = time.monotonic() + timeout
    while True:
        health = httpx.get(f"{gw.url}/health", timeout=5).json()
        if not health["shadow_queue"] and not health["shadow_in_flight"]:
            return health
        assert time.monotonic() < deadline, health
        time.sleep(0.05)


def chat(**extra: Any) -> dict[str, Any]:
    return {"model": ROUTE, "messages": [{"role": "user", "content": "hi"}], **extra}


def assert_openai_error(resp: httpx.Response, status: int) -> None:
    assert resp.status_code == status, resp.text[:300]
    err = resp.json()["error"]
    assert isinstance(err["message"], str) and err["type"] == "invalid_request_error"


# -- malformed requests: a 4xx, no upstream call ---------------------------------------------

HELLO = b'"messages": [{"role": "user", "content": "hi"}]'
MALFORMED = {
    "temperature NaN": b'{"model": "chat/int4", ' + HELLO + b', "temperature": NaN}',
    "top_p Infinity": b'{"model": "chat/int4", ' + HELLO + b', "top_p": Infinity}',
    "temperature 1e400": b'{"model": "chat/int4", ' + HELLO + b', "temperature": 1e400}',
    "lone surrogate": b'{"model": "chat/int4", "messages": [{"role": "user", '
    b'"content": "\\ud800"}]}',
    "200k nesting": b'{"model": "chat/int4", '
    + HELLO
    + b', "x": '
    + b"[" * 200_000
    + b"]" * 200_000
    + b"}",
    "not an object": b"[1, 2, 3]",
    "not json": b"{'model': 1}",
    "temperature a string": b'{"model": "chat/int4", ' + HELLO + b', "temperature": "hot"}',
    "too many messages": orjson.dumps(chat(messages=[{"role": "user", "content": "x"}] * 65)),
    "n x max_tokens": orjson.dumps(chat(n=8, max_tokens=1024)),
    "max_tokens 0": orjson.dumps(chat(max_tokens=0)),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_requests_get_a_400_and_no_upstream_call(
    case: str, gateway: GatewayProcess, scripted: Scripted
) -> None:
    before = len(scripted.calls)
    resp = httpx.post(
        f"{gateway.url}/v1/chat/completions",
        content=MALFORMED[case],
        headers={"content-type": "application/json"},
        timeout=10,
    )
    assert_openai_error(resp, 400)
    assert len(scripted.calls) == before, f"{case}: an upstream was called"


def test_a_body_past_the_limit_gets_413_unread_and_memory_stays_flat(
    gateway: GatewayProcess, scripted: Scripted
) -> None:
    """100 MB in (streamed, no Content-Length): 413 once 1 MiB is read; RSS grows < 32 MB."""
    rss_before, before = gateway.rss_mb(), len(scripted.calls)
    piece = b"x" * (1 << 20)

    def body() -> Iterator[bytes]:
        yield b'{"model": "chat/int4", "messages": [{"role": "user", "content": "'
        for _ in range(100):
            yield piece
        yield b'"}]}'

    try:
        resp = httpx.post(f"{gateway.url}/v1/chat/completions", content=body(), timeout=30)
        assert_openai_error(resp, 413)
    except httpx.HTTPError:
        pass  # the server may close the upload early; the status is checked below too
    big = orjson.dumps(chat(messages=[{"role": "user", "content": "y" * (2 << 20)}]))
    resp = httpx.post(f"{gateway.url}/v1/chat/completions", content=big, timeout=30)
    assert resp.status_code == 413 and resp.json()["error"]["code"] == "request_too_large"
    assert len(scripted.calls) == before
    grown = gateway.rss_mb() - rss_before
    assert grown < 32, f"RSS grew {grown:.0f} MB on refused bodies"


def test_no_caller_typed_name_reaches_a_header(gateway: GatewayProcess) -> None:
    """unknown_fields: drop lists dropped names in a header: only plain tokens, never CR/LF
    or non-latin-1 (both were a 500, and CR/LF was reflected after the paid call)."""
    raw = orjson.dumps(chat(**{"top_k_like": 1, "ключ": 1, "evil\r\nx-injected: yes": 1}))
    resp = httpx.post(f"{gateway.url}/v1/chat/completions", content=raw, timeout=10)
    assert resp.status_code == 200, resp.text
    assert "x-injected" not in resp.headers
    assert resp.headers["x-quantdrift-dropped-fields"] == "top_k_like,+2-unprintable"


def test_redos_schema_does_not_block_the_loop(gateway: GatewayProcess) -> None:
    """^(a+)+$ against 40 a's and "!" (hours under backtracking): /health stays < 100 ms."""
    schema = {
        "type": "object",
        "properties": {"a": {"type": "string", "pattern": "^(a+)+$"}},
        "required": ["a"],
    }
    body = chat(
        messages=[{"role": "user", "content": "json please"}],
        response_format={"type": "json_schema", "json_schema": {"name": "t", "schema": schema}},
    )

    async def run() -> tuple[httpx.Response, list[float], float]:
        # Two clients: /health's connection is open before the check starts, so its
        # times are the gateway's loop, not a TCP handshake.
        async with (
            httpx.AsyncClient(base_url=gateway.url, timeout=30) as client,
            httpx.AsyncClient(base_url=gateway.url, timeout=30) as probe,
        ):
            assert (await probe.get("/health")).status_code == 200
            t0 = time.perf_counter()
            task = asyncio.create_task(client.post("/v1/chat/completions", json=body))
            health: list[float] = []
            while not task.done() or len(health) < 5:
                h0 = time.perf_counter()
                assert (await probe.get("/health")).status_code == 200
                health.append(time.perf_counter() - h0)
                await asyncio.sleep(0.01)
            resp = await task
            return resp, health, time.perf_counter() - t0

    resp, health, took = asyncio.run(run())
    # Every model answer breaks the pattern: the last one is served (never a 5xx).
    assert resp.status_code == 200, resp.text
    assert max(health) < 0.1, f"/health took {max(health) * 1000:.0f} ms during the check"
    assert took < 5.0


def test_pairs_keep_flowing_after_a_schema_with_a_huge_integer(
    gateway: GatewayProcess, stack: EmbeddedStack
) -> None:
    """An integer >= 2^64 in json_schema killed the publisher; the next pairs stay flat no more.

    (orjson reads such an integer as a float at the door, and the publisher drops
    any pair it cannot encode: tests/integration/test_publisher.py drives that path.)
    """
    schema = {"type": "object", "properties": {"n": {"type": "integer", "maximum": 2**64 + 1}}}
    raw = orjson.dumps(
        chat(response_format={"type": "json_schema", "json_schema": {"schema": {}}})
    ).replace(b'"schema":{}', b'"schema":' + json.dumps(schema).encode())
    poisoned = httpx.post(f"{gateway.url}/v1/chat/completions", content=raw, timeout=10)
    assert poisoned.status_code == 200, poisoned.text
    ids = [poisoned.headers["x-request-id"]]
    for i in range(5):
        ok = httpx.post(f"{gateway.url}/v1/chat/completions", json=chat(user=f"u{i}"), timeout=10)
        assert ok.status_code == 200
        ids.append(ok.headers["x-request-id"])
    wanted = {f"{rid}:shadow" for rid in ids}
    records = asyncio.run(
        consume_n(
            stack.bootstrap,
            gateway.pairs_topic,
            len(wanted),
            timeout=30,
            predicate=lambda r: orjson.loads(r.value)["pair_id"] in wanted,
        )
    )
    assert {orjson.loads(r.value)["pair_id"] for r in records} == wanted
    metrics = httpx.get(f"{gateway.url}/metrics", timeout=5).text
    assert "quantdrift_gateway_task_crashes_total{" not in metrics  # no task ever crashed
    assert "quantdrift_gateway_ready 1.0" in metrics


# -- property-based: whatever the body, never a 5xx -----------------------------------------

_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
_FIELDS = [
    "model",
    "messages",
    "temperature",
    "top_p",
    "n",
    "max_tokens",
    "stream",
    "logprobs",
    "top_logprobs",
    "response_format",
    "stop",
    "seed",
]
_message = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "system", "assistant", "x"]), "content": _json}
)
_body = st.dictionaries(
    st.sampled_from(_FIELDS) | st.text(max_size=12),
    _json | st.lists(_message, min_size=1, max_size=3),
    max_size=6,
).map(lambda d: {"model": ROUTE, "messages": [{"role": "user", "content": "hi"}], **d})


@settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(body=_body, ascii_only=st.booleans())
def test_fuzzed_bodies_never_get_a_5xx(
    gateway: GatewayProcess, body: dict[str, Any], ascii_only: bool
) -> None:
    raw = json.dumps(body, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass")
    resp = httpx.post(
        f"{gateway.url}/v1/chat/completions",
        content=raw,
        headers={"content-type": "application/json"},
        timeout=20,
    )
    assert resp.status_code < 500, (resp.status_code, resp.text[:300])
    if resp.status_code >= 400:
        assert "error" in resp.json()


# -- shutdown: shadow work dropped with a count and a log line --------------------------------


def test_sigterm_with_a_hanging_reference_logs_what_it_dropped(
    scripted: Scripted, tmp_path: Path
) -> None:
    port_dead = free_port()  # no broker: pairs are not this test's seam
    config = gateway_config(scripted, reference="hang", shadow_drain_s=1.0, shadow_concurrency=2)
    env = {"QUANTDRIFT_KAFKA__BOOTSTRAP_SERVERS": f"127.0.0.1:{port_dead}"}
    gw = launch(tmp_path, "drain", config, env)
    try:
        gw.wait_up()
        hung = len(scripted.calls_to("hang"))
        for i in range(5):
            r = httpx.post(f"{gw.url}/v1/chat/completions", json=chat(user=f"s{i}"), timeout=10)
            assert r.status_code == 200
        deadline = time.monotonic() + 10
        while len(scripted.calls_to("hang")) < hung + 2:
            assert time.monotonic() < deadline, "shadow jobs never reached the reference"
            time.sleep(0.05)
        t0 = time.monotonic()
        gw.proc.send_signal(signal.SIGTERM)
        gw.proc.wait(timeout=15)
        took = time.monotonic() - t0
    finally:
        gw.stop()
    log = gw.tail(20_000)
    assert "shadow runner stopped after 1.0 s of draining: 3 queued and 2 running" in log, log
    assert took < 8.0, f"stopped in {took:.1f} s"


def test_api_keys_without_an_admin_token_refuse_to_start(
    scripted: Scripted, tmp_path: Path
) -> None:
    keys = [{"name": "team", "sha256": "0" * 64}]
    gw = launch(tmp_path, "keys", gateway_config(scripted, auth={"keys": keys}), {})
    assert gw.proc.wait(timeout=60) != 0
    assert "admin_token_sha256" in gw.tail()


# -- restart drills: fail closed ------------------------------------------------------------


def locked_rollback(route: str) -> bytes:
    command = RouteCommand.model_validate(
        {
            "command_id": f"{route}:console:{uuid.uuid4().hex[:6]}",
            "route": route,
            "action": "rollback",
            "target": "reference",
            "epoch": 7,
            "issued_at": time.time(),
            "locked": True,
        }
    )
    return CommandSigner("drill", SIGNING_KEY.encode()).seal(command)


@pytest.mark.parametrize("broker", ["up", "down"])
def test_restart_with_redis_down_and_a_locked_rollback_never_serves_the_candidate(
    broker: str, scripted: Scripted, stack: EmbeddedStack, tmp_path: Path
) -> None:
    """The console locked the route in rollback while this gateway was down; it starts with
    Redis unreachable. Broker up: the control topic's replay finds the lock. Broker down
    too: nothing says what the route does, so it serves its reference. Either way no
    user (and no shadow call) reaches the candidate."""
    control = unique_topic("hostile-control")
    env = {
        "QUANTDRIFT_REDIS__URL": f"redis://127.0.0.1:{free_port()}/0",
        "QUANTDRIFT_KAFKA__TOPICS__CONTROL": control,
        "QUANTDRIFT_KAFKA__BOOTSTRAP_SERVERS": (
            stack.bootstrap if broker == "up" else f"127.0.0.1:{free_port()}"
        ),
    }
    if broker == "up":
        asyncio.run(create_topics(stack.bootstrap, [control], partitions=1))
        asyncio.run(produce(stack.bootstrap, control, [(ROUTE.encode(), locked_rollback(ROUTE))]))
    gw = launch(tmp_path, f"restart-{broker}", gateway_config(scripted), env, control=True)
    try:
        gw.wait_up()
        before = len(scripted.calls_to("int4"))
        served = set()
        for i in range(20):
            r = httpx.post(f"{gw.url}/v1/chat/completions", json=chat(user=f"r{i}"), timeout=10)
            assert r.status_code == 200, r.text
            served.add(r.headers["x-quantdrift-precision"])
        assert served == {"bf16"}
        health = httpx.get(f"{gw.url}/health", timeout=5).json()
        assert health["routes"][ROUTE]["serving"] == "bf16"
        if broker == "up":
            # The replay of the control topic finds the lock itself; on a busy machine it
            # may end after the requests above (served the reference meanwhile): wait on it.
            deadline = time.monotonic() + 30
            while not health["control_known"] and time.monotonic() < deadline:
                time.sleep(0.2)
                health = httpx.get(f"{gw.url}/health", timeout=5).json()
            assert health["control_known"] is True, health
            assert health["routes"][ROUTE]["serving"] == "bf16"
            assert health["routes"][ROUTE]["epoch"] == 7
        else:
            assert health["control_known"] is False
        shadows_idle(gw)
        assert len(scripted.calls_to("int4")) == before
    finally:
        gw.stop()


def test_a_body_too_large_to_queue_is_served_but_not_mirrored(
    gateway: GatewayProcess, scripted: Scripted
) -> None:
    """Shadow jobs keep the request to re-ask the reference: past max_shadow_body_bytes
    (256 KiB by default) the user is served and the mirror is skipped, counted."""
    shadows_idle(gateway)  # earlier tests' shadow calls must not land in this window
    before = len(scripted.calls_to("bf16"))
    big = chat(messages=[{"role": "user", "content": "z" * (300 << 10)}])
    resp = httpx.post(f"{gateway.url}/v1/chat/completions", json=big, timeout=10)
    assert resp.status_code == 200
    metrics = httpx.get(f"{gateway.url}/metrics", timeout=5).text
    assert 'shadow_dropped_total{reason="too_large",stage="queue"} 1.0' in metrics
    shadows_idle(gateway)
    assert len(scripted.calls_to("bf16")) == before
