"""Exit codes and one-line errors of the real ``quantdrift`` process, against a real
broker and Redis (the session's embedded stack) or a port where nothing listens.

0 ok, 1 negative verdict, 2 usage or bad input, 3 runtime failure: see
``quantdrift.cli.exits``. An expected failure is one line on stderr, no traceback.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from quantdrift.stack.ports import free_port
from support import cli as support_cli
from support.cli import user_env
from support.guard import isolated_settings, make_topics


def quantdrift(
    *argv: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """The CLI as a user runs it: its own process, only the QUANTDRIFT_ variables given."""
    return support_cli.quantdrift(*argv, cwd=cwd, env=user_env(env), timeout=timeout)


def one_line(proc: subprocess.CompletedProcess[str]) -> str:
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert lines[0].startswith("quantdrift: error: ")
    return lines[0]


def dead_port() -> int:
    """A port where nothing listens, checked (not assumed) before and after use."""
    port = free_port()
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0
    return port


@pytest.mark.parametrize(
    "argv",
    [
        ["alerts", "tail"],
        ["alerts", "forward", "--alertmanager", "http://127.0.0.1:9", "--idle-exit-s", "1"],
        ["archive", "--dir", "archive", "--idle-exit-s", "1"],
        ["replay", "--topic", "--embedder", "none", "--out", "report"],
    ],
    ids=lambda a: " ".join(a[:2]),
)
def test_unreachable_broker_is_one_line_and_exit_3(argv: list[str], tmp_path: Path) -> None:
    port = dead_port()
    proc = quantdrift(
        *argv, cwd=tmp_path, env={"QUANTDRIFT_KAFKA__BOOTSTRAP_SERVERS": f"127.0.0.1:{port}"}
    )
    assert proc.returncode == 3, proc.stderr
    line = one_line(proc)
    assert f"cannot reach the Kafka broker at 127.0.0.1:{port}" in line
    assert not (tmp_path / "report").exists()  # nothing half-written


@pytest.mark.parametrize(
    "argv", [["route", "status"], ["route", "rollback", "--route", "x/int4"]], ids=" ".join
)
def test_unreachable_redis_is_one_line_and_exit_3(argv: list[str], tmp_path: Path) -> None:
    port = dead_port()
    proc = quantdrift(
        *argv, cwd=tmp_path, env={"QUANTDRIFT_REDIS__URL": f"redis://127.0.0.1:{port}/0"}
    )
    assert proc.returncode == 3, proc.stderr
    assert f"cannot reach Redis (Error 111 connecting to 127.0.0.1:{port}" in one_line(proc)


def test_malformed_signing_keys_is_one_line_and_exit_2(tmp_path: Path) -> None:
    proc = quantdrift("route", "status", cwd=tmp_path, env={"QUANTDRIFT_SIGNING__KEYS": "k1=abc"})
    assert proc.returncode == 2
    assert "QUANTDRIFT_SIGNING__" in one_line(proc)


def test_unknown_route_is_exit_2_and_a_known_one_is_0(stack, redis_prefix, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    settings = isolated_settings(stack, redis_prefix)
    asyncio.run(make_topics(settings))
    env = {
        "QUANTDRIFT_REDIS__URL": stack.redis_url,
        "QUANTDRIFT_REDIS__KEY_PREFIX": redis_prefix,
        "QUANTDRIFT_KAFKA__BOOTSTRAP_SERVERS": stack.bootstrap,
        "QUANTDRIFT_KAFKA__TOPICS__CONTROL": settings.kafka.topics.control,
        "QUANTDRIFT_KAFKA__TOPICS__ALERTS": settings.kafka.topics.alerts,
    }
    proc = quantdrift("route", "status", "--route", "no-such-route", cwd=tmp_path, env=env)
    assert proc.returncode == 2 and proc.stdout == ""
    assert "unknown route 'no-such-route'" in one_line(proc)

    proc = quantdrift("route", "rollback", "--route", "ops/int4", "--json", cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr
    done = json.loads(proc.stdout)  # one JSON document, nothing else on stdout
    assert (done["action"], done["target"], done["locked"], done["published"]) == (
        "rollback",
        "reference",
        True,
        True,
    )
    proc = quantdrift("route", "status", "--route", "ops/int4", "--json", cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr
    assert [r["route"] for r in json.loads(proc.stdout)] == ["ops/int4"]


def test_alerts_tail_on_a_topic_not_created_yet(stack, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A fresh stack has no alerts topic until the first alert: no alerts, not a crash."""
    env = {
        "QUANTDRIFT_KAFKA__BOOTSTRAP_SERVERS": stack.bootstrap,
        "QUANTDRIFT_KAFKA__TOPICS__ALERTS": f"fresh-{uuid.uuid4().hex[:8]}.alerts.v1",
    }
    proc = quantdrift("alerts", "tail", "--json", cwd=tmp_path, env=env)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "", "")
    proc = quantdrift("alerts", "tail", cwd=tmp_path, env=env)
    assert proc.returncode == 0 and "no alerts" in proc.stdout, proc.stderr


def test_replay_of_an_empty_topic_is_exit_2(stack, redis_prefix, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    settings = isolated_settings(stack, redis_prefix)
    asyncio.run(make_topics(settings))
    env = {"QUANTDRIFT_KAFKA__BOOTSTRAP_SERVERS": stack.bootstrap}
    proc = quantdrift(
        "replay",
        "--topic",
        settings.kafka.topics.pairs,
        "--embedder",
        "none",
        "--timeout-s",
        "3",
        "--out",
        "report",
        cwd=tmp_path,
        env=env,
    )
    assert proc.returncode == 2, proc.stderr
    assert "nothing to replay from topic" in one_line(proc)


def test_replay_of_nothing_readable_or_no_file_is_exit_2(tmp_path: Path) -> None:
    (tmp_path / "junk.jsonl").write_text('not json\n{"x": 1}\n')
    proc = quantdrift("replay", "--input", "junk.jsonl", "--embedder", "none", cwd=tmp_path)
    assert proc.returncode == 2
    assert "nothing to replay from junk.jsonl: 2 unreadable records" in one_line(proc)
    proc = quantdrift("replay", "--input", "missing.jsonl", "--embedder", "none", cwd=tmp_path)
    assert proc.returncode == 2
    assert "missing.jsonl" in one_line(proc)


def test_usage_errors_are_exit_2(tmp_path: Path) -> None:
    proc = quantdrift("route", "rollback", cwd=tmp_path)
    assert proc.returncode == 2 and "needs --route" in one_line(proc)
    proc = quantdrift("score", "@missing.txt", "b", "--embedder", "none", cwd=tmp_path)
    assert proc.returncode == 2 and "missing.txt" in one_line(proc)
    proc = quantdrift("gateway", "--config", "missing.yaml", cwd=tmp_path)
    assert proc.returncode == 2 and "missing.yaml" in one_line(proc)


def test_no_redis_configured_is_exit_2_not_whatever_answers_on_6379(tmp_path: Path) -> None:
    """Whether or not a Redis answers on :6379 (the test machine's usually does), a
    command with no Redis configured and no stack state refuses instead of using it."""
    proc = quantdrift("route", "status", cwd=tmp_path)
    assert proc.returncode == 2
    assert "no Redis configured: set QUANTDRIFT_REDIS__URL" in one_line(proc)


def test_worker_runs_from_a_settings_file_alone(stack, redis_prefix, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """No QUANTDRIFT_ variable at all: broker, Redis, topics and the status port come
    from ``worker --config``; the status page answering on that port proves it."""
    import time

    import httpx
    import yaml

    settings = isolated_settings(stack, redis_prefix)
    asyncio.run(make_topics(settings))
    port = free_port()
    config = {
        "kafka": {
            "bootstrap_servers": stack.bootstrap,
            "partitions": settings.kafka.partitions,
            "topics": settings.kafka.topics.model_dump(),
        },
        "redis": {"url": stack.redis_url, "key_prefix": redis_prefix},
        "embedding": {"model": "none", "tier": "none"},
        "worker": {"app_id": settings.worker.app_id, "web_port": port},
    }
    (tmp_path / "worker.yaml").write_text(yaml.safe_dump(config))
    base = {k: v for k, v in os.environ.items() if not k.startswith("QUANTDRIFT_")}
    log = (tmp_path / "worker.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "quantdrift", "worker", "--config", "worker.yaml"],
        cwd=tmp_path,
        env={**base, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"},
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 90
        up = False
        while time.monotonic() < deadline and proc.poll() is None and not up:
            try:
                up = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200
            except httpx.HTTPError:
                time.sleep(0.2)
        assert up, (tmp_path / "worker.log").read_text()[-2000:]
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()
