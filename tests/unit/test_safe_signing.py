"""The built-in dev signing key works on loopback only: anywhere else, refuse to start.
Keys shorter than 32 bytes (empty, one letter) are refused everywhere."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from quantdrift.config import (
    MIN_SIGNING_KEY_BYTES,
    KafkaSettings,
    Settings,
    SigningSettings,
    require_safe_signing,
)
from quantdrift.errors import ConfigError
from support.cli import quantdrift

LOOPBACK_REDIS = "redis://127.0.0.1:6379/0"


@pytest.mark.parametrize(
    ("bootstrap", "redis_url"),
    [
        ("127.0.0.1:9092", LOOPBACK_REDIS),
        ("localhost:9092,[::1]:9093", "redis://localhost:6379"),
    ],
)
def test_dev_key_on_loopback_is_fine(bootstrap: str, redis_url: str) -> None:
    require_safe_signing(Settings(kafka=KafkaSettings(bootstrap_servers=bootstrap)), redis_url)


@pytest.mark.parametrize(
    ("bootstrap", "redis_url", "culprit"),
    [
        ("kafka:9092", LOOPBACK_REDIS, "kafka"),
        ("127.0.0.1:9092,10.0.0.7:9092", LOOPBACK_REDIS, "10.0.0.7"),
        ("127.0.0.1:9092", "rediss://:pw@cache.internal:6380/0", "cache.internal"),
    ],
)
def test_dev_key_beyond_loopback_is_refused(bootstrap: str, redis_url: str, culprit: str) -> None:
    settings = Settings(kafka=KafkaSettings(bootstrap_servers=bootstrap))
    with pytest.raises(ConfigError, match=f"dev signing key.*{culprit}"):
        require_safe_signing(settings, redis_url)


def test_own_key_beyond_loopback_is_fine() -> None:
    settings = Settings(
        kafka=KafkaSettings(bootstrap_servers="kafka:9092"),
        signing=SigningSettings(active_key_id="prod", keys={"prod": "p" * MIN_SIGNING_KEY_BYTES}),  # type: ignore[dict-item]
    )
    require_safe_signing(settings, "redis://redis:6379/0")


def test_no_key_at_all_is_refused_even_on_loopback() -> None:
    settings = Settings(signing=SigningSettings(active_key_id="x", keys={}))
    with pytest.raises(ConfigError, match="no command signing key"):
        require_safe_signing(settings, LOOPBACK_REDIS)


@pytest.mark.parametrize(
    "keys",
    [
        {"prod": ""},
        {"prod": "x"},
        {"prod": "a-real-secret"},
        {"prod": "p" * (MIN_SIGNING_KEY_BYTES - 1)},
        # a long active key does not excuse a short one the gateways still accept
        {"prod": "p" * MIN_SIGNING_KEY_BYTES, "old": "short"},
        # bytes, not characters: 10 CJK characters are 30 bytes
        {"prod": "密" * 10},
    ],
)
def test_short_or_empty_keys_are_refused_even_on_loopback(keys: dict[str, str]) -> None:
    settings = Settings(signing=SigningSettings(active_key_id="prod", keys=keys))  # type: ignore[arg-type]
    refusal = r"signing key '(prod|old)' is \d+ bytes, needs at least 32"
    with pytest.raises(ConfigError, match=refusal):
        require_safe_signing(settings, LOOPBACK_REDIS)


def test_the_dev_key_itself_is_long_enough() -> None:
    from quantdrift.config import DEV_KEY

    assert len(DEV_KEY.encode()) >= MIN_SIGNING_KEY_BYTES


def test_short_key_refusal_is_one_line_from_the_cli(tmp_path: Path) -> None:
    env = {
        "PATH": "/usr/bin:/bin",
        # the checkout under test, not whichever one the venv has installed
        "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src"),
        "QUANTDRIFT_REDIS__URL": "redis://127.0.0.1:6379/0",
        "QUANTDRIFT_SIGNING__ACTIVE_KEY_ID": "prod",
        "QUANTDRIFT_SIGNING__KEYS": '{"prod": ""}',
    }
    proc = subprocess.run(
        [sys.executable, "-m", "quantdrift", "worker"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stderr  # malformed settings: bad input (docs/cli.md)
    lines = proc.stderr.strip().splitlines()
    assert lines == [
        "quantdrift: error: refusing to start: signing key 'prod' is 0 bytes, needs at least 32 "
        "(set QUANTDRIFT_SIGNING__KEYS to random keys, e.g. from `openssl rand -hex 32`)"
    ], proc.stderr


@pytest.mark.parametrize(
    "argv",
    [
        ["worker"],
        ["route", "rollback", "--route", "r/int4"],
        ["gateway", "--config", "examples/gateway.yaml"],
    ],
)
def test_every_command_that_signs_or_obeys_refuses_with_one_line(
    argv: list[str], tmp_path: Path
) -> None:
    root = Path(__file__).resolve().parents[2]
    env = {
        "PATH": "/usr/bin:/bin",
        # the checkout under test, not whichever one the venv has installed
        "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src"),
        "QUANTDRIFT_KAFKA__BOOTSTRAP_SERVERS": "kafka.prod.internal:9092",
        "QUANTDRIFT_REDIS__URL": "redis://127.0.0.1:6379/0",
        # the checkout under test, when it is not the installed one
        **{k: v for k, v in os.environ.items() if k == "PYTHONPATH"},
    }
    args = [a if not a.startswith("examples/") else str(root / a) for a in argv]
    proc = quantdrift(*args, cwd=tmp_path, env=env, timeout=60)
    assert proc.returncode == 2, proc.stderr  # a settings problem: exit 2 (cli.exits)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("quantdrift: error: refusing to start: the built-in dev signing")
    assert "kafka.prod.internal" in lines[0]
