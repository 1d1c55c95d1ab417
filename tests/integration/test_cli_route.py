"""`quantdrift route ...` and `quantdrift schema export` as an operator runs them."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest
import redis
import redis.asyncio as aioredis

from quantdrift.breaker.policy import load_policy
from quantdrift.breaker.store import RedisBreakerStore
from quantdrift.cli import main
from quantdrift.schemas.keys import command_key
from quantdrift.schemas.score import Metrics, ScoreEvent
from quantdrift.schemas.signing import signer_from_settings, verifier_from_settings
from support.guard import isolated_settings, make_topics
from support.kafka import consume_n


def test_manual_rollback_is_signed_locked_and_published(
    stack, redis_prefix, monkeypatch, capsys
) -> None:  # type: ignore[no-untyped-def]
    settings = isolated_settings(stack, redis_prefix)
    asyncio.run(make_topics(settings))
    monkeypatch.chdir(Path(__file__).parent)  # no .quantdrift/stack.json here
    monkeypatch.setenv("QUANTDRIFT_KAFKA__BOOTSTRAP_SERVERS", stack.bootstrap)
    monkeypatch.setenv("QUANTDRIFT_REDIS__URL", stack.redis_url)
    monkeypatch.setenv("QUANTDRIFT_REDIS__KEY_PREFIX", redis_prefix)
    monkeypatch.setenv("QUANTDRIFT_KAFKA__TOPICS__CONTROL", settings.kafka.topics.control)
    monkeypatch.setenv("QUANTDRIFT_KAFKA__TOPICS__ALERTS", settings.kafka.topics.alerts)

    assert main(["route", "rollback", "--route", "ops/int4"]) == 0
    assert "(locked)" in capsys.readouterr().out
    raw = redis.Redis.from_url(stack.redis_url).get(command_key(redis_prefix, "ops/int4"))
    verifier = verifier_from_settings(settings.signing.keys)
    command = verifier.open(raw)
    verifier.check(command, last_epoch=0, now=time.time())
    assert (command.action, command.target, command.locked, command.source) == (
        "rollback",
        "reference",
        True,
        "manual",
    )

    records = asyncio.run(consume_n(stack.bootstrap, settings.kafka.topics.control, 1, timeout=10))
    assert records[0].value == raw  # the very bytes that were signed, on both paths

    assert main(["route", "release", "--route", "ops/int4"]) == 0
    assert main(["route", "status", "--route", "ops/int4"]) == 0
    out = capsys.readouterr().out
    assert "ops/int4: open target=reference" in out and "LOCKED" not in out


def test_bad_arguments_get_one_line(capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["route", "rollback"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "needs --route" in err
    with pytest.raises(SystemExit) as info:
        main(["route", "explode", "--route", "x"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "invalid choice" in err


def test_schema_export(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["schema", "export", "--out", str(tmp_path / "schemas")]) == 0
    assert len(list((tmp_path / "schemas").glob("*.v1.schema.json"))) == 8


def test_status_says_whether_a_route_is_armed_or_what_it_needs(
    stack, redis_prefix, monkeypatch, capsys, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    """Folded through the store the worker uses, read back by ``quantdrift route status``."""
    policy_file = tmp_path / "policy.yaml"
    policy_file.write_text("default:\n  min_pairs: 5\n")
    settings = isolated_settings(stack, redis_prefix)
    monkeypatch.chdir(Path(__file__).parent)
    monkeypatch.setenv("QUANTDRIFT_REDIS__URL", stack.redis_url)
    monkeypatch.setenv("QUANTDRIFT_REDIS__KEY_PREFIX", redis_prefix)
    monkeypatch.setenv("QUANTDRIFT_POLICY_FILE", str(policy_file))
    policy = load_policy(policy_file).for_route("ops/armed")
    signer = signer_from_settings(settings.signing.active_key_id, settings.signing.keys)

    async def fold(first: int, count: int) -> None:
        client = aioredis.Redis.from_url(stack.redis_url)
        store = RedisBreakerStore(client, signer, key_prefix=redis_prefix)
        for i in range(first, first + count):
            score = ScoreEvent(
                pair_id=f"p-{i}",
                route="ops/armed",
                kind="shadow",
                ts=float(i),
                decoding="greedy",
                metrics=Metrics(cosine=0.99, rougeL=0.9),
                verdict="ok",
                reasons=[],
                tags={"language": "en" if i % 2 else "zh", "length": "short", "output": "text"},
            )
            await store.fold(score, policy, time.time())
        await client.aclose()

    async def bless() -> None:
        """What ``quantdrift calibrate --blessed-label`` writes: a greedy blessed floor."""
        client = aioredis.Redis.from_url(stack.redis_url)
        store = RedisBreakerStore(client, signer, key_prefix=redis_prefix)
        rows = [
            {"blessed:cosine": 0.97 + i / 1000, "blessed:rougeL": 0.8 + i / 100} for i in range(12)
        ]
        await store.seed_floor("ops/armed", "greedy", rows)
        await client.aclose()

    asyncio.run(fold(0, 2))
    assert main(["route", "status", "--route", "ops/armed"]) == 0
    out = capsys.readouterr().out
    assert "armed=no (warming: 2 of 5 shadow pairs seen; abstaining: " in out
    assert "tolerance:dissimilarity  abstains  below min_pairs: 2 of 5; no blessing" in out
    # Slices below their minimum pairs are a state of their own, never a pass.
    assert "slice language=zh   insufficient data: 1 of 20 pairs" in out
    assert "slice length=short  insufficient data: 2 of 20 pairs" in out
    asyncio.run(fold(2, 3))
    assert main(["route", "status", "--route", "ops/armed", "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert (row["armed"], row["readiness"], row["pairs_seen"]) == (False, "partly armed", 5)
    assert [m.split(":")[1] for m in row["missing"]] == ["dissimilarity", "lexical"]
    assert "no blessing: 0 greedy noise pairs" in row["missing"][0]
    assert row["reason"].startswith("partly armed: 5 shadow pairs"), row
    slices = {r["slice"]: (r["pairs"], r["status"]) for r in row["slices"]}
    assert slices == {
        "language=zh": (3, "insufficient_data"),
        "language=en": (2, "insufficient_data"),
        "length=short": (5, "insufficient_data"),
        "output=text": (5, "insufficient_data"),
    }
    asyncio.run(bless())
    assert main(["route", "status", "--route", "ops/armed", "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert (row["armed"], row["readiness"], row["missing"]) == (True, "armed", [])
    assert row["reason"].startswith("closed and armed: 5 shadow pairs"), row
    can_fire = {r["rule"] for r in row["rules"] if r["status"] == "can_fire"}
    assert {"tolerance:hard", "tolerance:dissimilarity", "tolerance:lexical"} <= can_fire
