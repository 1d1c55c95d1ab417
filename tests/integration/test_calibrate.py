"""`quantdrift calibrate` against the real Redis: the floor lands where the worker reads it."""

from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path

import orjson
import pytest
import redis

from quantdrift.breaker.store import RedisBreakerStore
from quantdrift.cli import main
from quantdrift.schemas import ModelOutput, PairEvent, RequestInfo
from quantdrift.schemas.keys import route_key
from quantdrift.schemas.pair import EngineInfo
from quantdrift.schemas.signing import CommandSigner
from quantdrift.stack.ports import free_port
from support.guard import isolated_settings, make_topics

WORDS = "the a model answer route paris france capital city river blue sky cat mat".split()  # noqa: SIM905


def noise_pair(i: int, temperature: float, identical: bool, rng: random.Random) -> PairEvent:
    ref = " ".join(rng.choice(WORDS) for _ in range(12))
    other = ref if identical else " ".join(rng.choice(WORDS) for _ in range(12))
    return PairEvent(
        pair_id=f"n{i}",
        ts=float(i),
        route="lab/noise",
        kind="noise",
        candidate=ModelOutput(text=other),
        reference=ModelOutput(text=ref),
        request=RequestInfo(temperature=temperature),
        label="noise",
    )


@pytest.fixture
def pairs_file(tmp_path: Path) -> Path:
    rng = random.Random(3)
    pairs = [noise_pair(i, 0.7, False, rng) for i in range(40)]
    # Two greedy reference runs are identical: they must not become the greedy floor.
    pairs += [noise_pair(100 + i, 0.0, True, rng) for i in range(40)]
    path = tmp_path / "noise.jsonl"
    path.write_text("\n".join(p.model_dump_json() for p in pairs) + "\n")
    return path


def floor_hash(url: str, key: str) -> tuple[int, dict[str, list[float]]]:
    raw = redis.Redis.from_url(url).hmget(key, "v", "s")
    return int(raw[0]), orjson.loads(raw[1])


def test_calibrate_seeds_floor_per_route_and_mode(  # type: ignore[no-untyped-def]
    stack, redis_prefix, pairs_file, monkeypatch, capsys
) -> None:
    monkeypatch.chdir(pairs_file.parent)  # no .quantdrift/stack.json here
    base = ["calibrate", str(pairs_file), "--redis-url", stack.redis_url]
    base += ["--key-prefix", redis_prefix, "--embedder", "none", "--json"]
    assert main([*base, "--route", "cs-agent/int4"]) == 0
    rows = json.loads(capsys.readouterr().out)  # exactly one document
    by_mode = {r["mode"]: r for r in rows}
    assert by_mode["sampled"]["seeded"] == 40 and by_mode["sampled"]["floor_pairs"] == 40
    # The identical greedy pairs are dropped, and greedy never borrows the sampled floor.
    assert "greedy" not in by_mode

    v, sampled = floor_hash(
        stack.redis_url, route_key(redis_prefix, "cs-agent/int4", "noise:sampled")
    )
    assert v == 1 and len(sampled["rougeL"]) == 40 and "cosine" not in sampled
    assert not redis.Redis.from_url(stack.redis_url).exists(
        route_key(redis_prefix, "cs-agent/int4", "noise:greedy")
    )
    assert not redis.Redis.from_url(stack.redis_url).exists(
        route_key(redis_prefix, "lab/noise", "noise:sampled")
    )

    # The store the worker uses reads the same floor.
    async def read() -> int:
        import redis.asyncio as aioredis

        client = aioredis.Redis.from_url(stack.redis_url)
        store = RedisBreakerStore(client, CommandSigner("k", b"secret"), key_prefix=redis_prefix)
        try:
            floor, version = await store.read_floor("cs-agent/int4", "sampled")
            return floor.count("rougeL") * 10 + version
        finally:
            await client.aclose()

    assert asyncio.run(read()) == 401

    # Re-running replaces (idempotent), --merge appends; each write bumps the version.
    assert main([*base, "--route", "cs-agent/int4"]) == 0
    assert main([*base, "--route", "cs-agent/int4", "--merge"]) == 0
    capsys.readouterr()
    v, sampled = floor_hash(
        stack.redis_url, route_key(redis_prefix, "cs-agent/int4", "noise:sampled")
    )
    assert v == 3 and len(sampled["rougeL"]) == 80

    # Without --route, the file's own route.
    assert main(base) == 0
    assert "lab/noise" in capsys.readouterr().out
    assert (
        floor_hash(stack.redis_url, route_key(redis_prefix, "lab/noise", "noise:sampled"))[0] == 1
    )


def test_calibrate_rejects_a_file_without_noise_pairs(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "empty.jsonl"
    path.write_text("")
    assert main(["calibrate", str(path), "--embedder", "none"]) == 2
    assert "no noise pairs" in capsys.readouterr().err


def test_a_baseline_is_blessed_from_gateway_pairs_by_the_build_that_served_it(  # type: ignore[no-untyped-def]
    stack, redis_prefix, tmp_path, monkeypatch, capsys
) -> None:
    """A gateway's pairs carry no label: the operator names the candidate build that
    served the traffic they approve (its engine identity), and only its pairs bless."""
    rng = random.Random(5)

    def shadow(i: int, model: str) -> PairEvent:
        ref = " ".join(rng.choice(WORDS) for _ in range(12))
        served = EngineInfo(engine="vllm", version="0.32.0", model=model)
        return PairEvent(
            pair_id=f"s{i}",
            ts=float(i),
            route="cs-agent/int4",
            candidate=ModelOutput(text=ref[:-3], precision="int4", model=model, engine=served),
            reference=ModelOutput(text=ref, precision="bf16"),
            request=RequestInfo(temperature=0.0),
        )

    pairs = [shadow(i, "int8") for i in range(30)] + [shadow(100 + i, "int2") for i in range(30)]
    path = tmp_path / "archived.jsonl"
    path.write_text("\n".join(p.model_dump_json() for p in pairs) + "\n")
    monkeypatch.chdir(tmp_path)
    argv = ["calibrate", str(path), "--redis-url", stack.redis_url, "--key-prefix", redis_prefix]
    argv += ["--embedder", "none", "--json", "--blessed-label", "vllm/0.32.0/int8"]
    assert main(argv) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert (row["route"], row["mode"], row["seeded"]) == ("cs-agent/int4", "greedy", 30)
    _, floor = floor_hash(stack.redis_url, route_key(redis_prefix, "cs-agent/int4", "noise:greedy"))
    assert len(floor["blessed:rougeL"]) == 30


def test_calibrate_from_a_topic_says_what_it_cannot_read(  # type: ignore[no-untyped-def]
    stack, redis_prefix, tmp_path, monkeypatch, capsys
) -> None:
    """The broker unreachable (exit 3, as every command), a topic that does not exist,
    an empty range, a partition the topic lacks (exit 2): one line each, nothing written.
    Reading gateway-made pairs from the live topic is ``test_armed_e2e.py``'s step 3."""
    settings = isolated_settings(stack, redis_prefix)
    asyncio.run(make_topics(settings))
    monkeypatch.chdir(tmp_path)  # no .quantdrift/stack.json here
    monkeypatch.setenv("QUANTDRIFT_REDIS__URL", stack.redis_url)
    monkeypatch.setenv("QUANTDRIFT_REDIS__KEY_PREFIX", redis_prefix)
    topic = settings.kafka.topics.pairs

    def refused(bootstrap: str, *argv: str) -> tuple[int, str]:
        monkeypatch.setenv("QUANTDRIFT_KAFKA__BOOTSTRAP_SERVERS", bootstrap)
        code = main(["calibrate", "--topic", *argv, "--embedder", "none", "--timeout-s", "5"])
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("quantdrift: error: "), err
        return code, err

    port = free_port()
    code, err = refused(f"127.0.0.1:{port}", topic)
    assert code == 3 and f"cannot reach the Kafka broker at 127.0.0.1:{port}" in err
    code, err = refused(stack.bootstrap, f"{topic}-missing")
    assert code == 2 and f"topic '{topic}-missing' not found" in err
    code, err = refused(stack.bootstrap, topic, "--route", "cs-agent/int4")
    assert code == 2 and f"nothing to calibrate from topic {topic} @ {stack.bootstrap}" in err
    assert "the whole topic: no pairs in the range" in err
    code, err = refused(stack.bootstrap, topic, "--from-offset", "100", "--to-offset", "200")
    assert code == 2 and "offsets [100, 200): no pairs in the range" in err
    code, err = refused(stack.bootstrap, topic, "--partition", "7")
    assert code == 2 and f"topic '{topic}' has no partition 7 (it has 0, 1)" in err
    assert not list(redis.Redis.from_url(stack.redis_url).scan_iter(match=f"{redis_prefix}*"))
