"""The gateway-side checks: ``probes`` (config only) and ``shadow-link``.

``shadow-link`` proves four things a launch needs from the shadow path:
the config mirrors the intended share; a pair published to the pairs topic
comes back as a ScoreEvent (so a worker is really scoring); scoring a
pair costs under 10 ms at p99 on the route's own recorded pairs (timed one
pair at a time with the worker's own scorer, the worst case: the worker
batches); and **the route is armed**: every divergence test it relies on has the
floor it needs to fire (the console's ``launch_readiness``), so the pairs the
link carries are judged by more than the hard-failure and outcome tests. The
round-trip pair goes on a probe route, ``preflight-probe/<route>``, so the real
route's breaker never sees it.
"""

from __future__ import annotations

import asyncio
import gzip
import time
import uuid
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from quantdrift.detectors.suite import score_event
from quantdrift.errors import ConfigError, SchemaError
from quantdrift.gateway.gateway_config import load_config
from quantdrift.kafka_clients import consumer_kwargs, producer_kwargs
from quantdrift.preflight.context import Context
from quantdrift.preflight.report import Item, judged, skipped
from quantdrift.schemas import PairEvent, unverified_score
from quantdrift.schemas.record_keys import pair_record_key

if TYPE_CHECKING:
    from quantdrift.gateway.gateway_config import GatewayConfig
    from quantdrift.schemas import PairEvent

PROBES = "probes"
SHADOW = "shadow-link"
TITLES = {
    PROBES: "Streaming entropy and repetition probes and the JSON guard are on for the route",
    SHADOW: "Shadow link: share mirrored, pair -> ScoreEvent, per-pair cost p99 < 10 ms, "
    "the route armed",
}


def _gateway_config(ctx: Context) -> tuple[GatewayConfig | None, str | None]:
    path = ctx.config.gateway_config
    if path is None:
        return None, "set gateway_config (the gateway's YAML)"
    cfg = load_config(path)
    route = ctx.config.route or cfg.route_default
    if route not in cfg.routes:
        raise ConfigError(f"route {route!r} is not in {Path(path).name}")
    return cfg, route


def probe_settings(cfg: GatewayConfig) -> dict[str, Any]:
    """What the gateway's guards will do, read off its config (pure)."""
    d, j = cfg.degeneration, cfg.json_guard
    return {
        "degeneration_enabled": d.enabled,
        "repetition_probe": d.enabled and d.repetition,
        # The entropy probe needs the upstream's top log-probs on user calls.
        "entropy_probe": d.enabled and d.entropy and cfg.logprobs_on_user_calls
        and cfg.top_logprobs > 0,
        "json_guard": True,  # always on for requests that ask for JSON
        "json_whitespace_guard": j.max_whitespace_run is not None,
        "entropy_floor": d.entropy_floor,
        "stream_holdback_tokens": cfg.stream_holdback_tokens,
    }  # fmt: skip


def probes_ok(s: dict[str, Any]) -> tuple[bool, str]:
    needed = ("repetition_probe", "entropy_probe", "json_guard", "json_whitespace_guard")
    off = [k for k in needed if not s[k]]
    if off:
        return False, f"off: {', '.join(off)}"
    return True, "repetition and entropy probes on, JSON guard on"


async def probes(ctx: Context) -> Item:
    cfg, route = _gateway_config(ctx)
    if cfg is None:
        return skipped(PROBES, TITLES[PROBES], str(route))
    s = probe_settings(cfg)
    ok, why = probes_ok(s)
    return judged(
        PROBES,
        TITLES[PROBES],
        ok,
        s,
        {"required": ["repetition_probe", "entropy_probe", "json_guard", "json_whitespace_guard"]},
        why=why,
        route=route,
    )


# -- shadow link ---------------------------------------------------------------------


def read_pairs(path: Path | None, route: str | None, limit: int) -> tuple[list[PairEvent], str]:
    """The route's recorded shadow pairs (all shadow pairs when the route has none)."""
    try:
        if path is None:  # the lab's recorded pairs, shipped in the package
            raw = resources.files("quantdrift.data").joinpath("lab_pairs.jsonl.gz").read_bytes()
        else:
            raw = path.read_bytes()
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
        pairs = [PairEvent.parse(line) for line in raw.splitlines() if line.strip()]
    except (OSError, SchemaError) as exc:
        raise ConfigError(f"recorded pairs {path or 'lab_pairs.jsonl.gz'}: {exc}") from exc
    shadow = [p for p in pairs if p.kind == "shadow"]
    own = [p for p in shadow if p.route == route]
    if own:
        return own[:limit], f"{len(own[:limit])} recorded pairs of {route}"
    return shadow[:limit], f"{route} has no recorded pairs: {len(shadow[:limit])} of all routes"


def p99(values: list[float]) -> float:
    """Nearest-rank 99th percentile.

    >>> p99([float(i) for i in range(1, 101)])
    99.0
    """
    s = sorted(values)
    return s[max(0, -(-99 * len(s) // 100) - 1)]


def time_scoring(pairs: list[PairEvent], score: Callable[[list[PairEvent]], Any]) -> list[float]:
    """Milliseconds to score each pair alone, after a warm-up pass (model load excluded)."""
    for p in pairs[:3]:
        score([p])
    out = []
    for p in pairs:
        t0 = time.perf_counter()
        metrics = score([p])[0]
        score_event(p, metrics)
        out.append((time.perf_counter() - t0) * 1000)
    return out


async def roundtrip(ctx: Context, pair: PairEvent, route: str, timeout_s: float) -> float:
    """Publish one pair on the probe route; seconds until its ScoreEvent is on the scores topic."""
    assert ctx.settings is not None
    kafka = ctx.settings.kafka
    probe_route = f"preflight-probe/{route}"
    pair_id = f"preflight-{uuid.uuid4().hex}"
    probe = pair.model_copy(update={"pair_id": pair_id, "route": probe_route, "ts": time.time()})
    consumer = AIOKafkaConsumer(
        **{**consumer_kwargs(kafka), "group_id": None, "enable_auto_commit": False}
    )
    producer = AIOKafkaProducer(**producer_kwargs(kafka))
    try:
        async with asyncio.timeout(timeout_s):
            await consumer.start()
            parts = None
            while not parts:  # the topic may be created by the first subscriber
                parts = consumer.partitions_for_topic(kafka.topics.scores)
                if not parts:
                    await consumer.client.force_metadata_update()
                    await asyncio.sleep(0.2)
            tps = [TopicPartition(kafka.topics.scores, p) for p in parts]
            consumer.assign(tps)
            await consumer.seek_to_end(*tps)
            await producer.start()
            t0 = time.perf_counter()
            await producer.send_and_wait(
                kafka.topics.pairs, probe.model_dump_json().encode(), key=pair_record_key(probe)
            )
            while True:
                batches = await consumer.getmany(timeout_ms=200)
                for records in batches.values():
                    for rec in records:
                        try:
                            score = unverified_score(rec.value)
                        except SchemaError:
                            continue
                        if score.pair_id == pair_id:
                            return time.perf_counter() - t0
    finally:
        await producer.stop()
        await consumer.stop()


def expected_tests(cfg: GatewayConfig, route: str, ctx: Context) -> tuple[str, ...]:
    """The divergence tests the route's pairs will carry evidence for (pure config)."""
    rc = cfg.routes[route]
    tests = ["lexical"]
    if ctx.settings is not None and ctx.settings.embedding.tier != "none":
        tests.append("dissimilarity")
    if rc.teacher_forced:
        tests.append("tf_kl")
    if cfg.pool(rc.candidate).logprobs and cfg.pool(rc.reference).logprobs:
        tests.append("entropy")
    return tuple(tests)


async def shadow_link(ctx: Context) -> Item:
    c = ctx.config.shadow_link
    cfg, route = _gateway_config(ctx)
    if cfg is None or route is None:
        return skipped(SHADOW, TITLES[SHADOW], str(route))
    console, build = ctx.console, ctx.scorer
    if console is None or build is None:
        return skipped(SHADOW, TITLES[SHADOW], "needs the console and the worker's scorer")
    share = cfg.shadow_rate(route)
    share_ok = abs(share - c.expected_share) < 1e-9
    problems = [] if share_ok else [f"mirrors {share:.1%}, intended {c.expected_share:.1%}"]

    pairs, source = read_pairs(c.recorded_pairs, route, c.max_pairs)
    ctx.progress(f"{SHADOW}: timing the scorer on {source}")
    assert ctx.settings is not None
    score = await asyncio.to_thread(build, ctx.settings.embedding)
    times = await asyncio.to_thread(time_scoring, pairs, score)
    cost = p99(times) if times else float("inf")
    if cost >= c.p99_ms:
        problems.append(f"per-pair cost p99 {cost:.1f} ms >= {c.p99_ms:g} ms")

    rt: float | None = None
    if c.roundtrip:
        ctx.progress(f"{SHADOW}: publishing a probe pair and waiting for its ScoreEvent")
        try:
            rt = await roundtrip(ctx, pairs[0], route, c.roundtrip_timeout_s)
        except TimeoutError:
            problems.append(
                f"no ScoreEvent within {c.roundtrip_timeout_s:g}s (is a worker running?)"
            )
        except Exception as exc:  # aiokafka raises its own tree; the report says which
            problems.append(f"Kafka round trip failed: {exc!r}")
    else:
        problems.append("round trip not run (shadow_link.roundtrip: false)")

    ctx.progress(f"{SHADOW}: reading whether the route's divergence tests can fire")
    armed = await console.launch_readiness(ctx.settings, route, expected_tests(cfg, route, ctx))
    if not armed["armed"]:
        problems.append("the route is not armed: " + " | ".join(armed["missing"]))
    return judged(
        SHADOW,
        TITLES[SHADOW],
        not problems,
        {
            "shadow_share": share,
            "scoring_p99_ms": round(cost, 3),
            "scoring_p50_ms": round(sorted(times)[len(times) // 2], 3) if times else None,
            "pairs_timed": len(times),
            "roundtrip_s": None if rt is None else round(rt, 3),
            "scorer": ctx.settings.embedding.tier,
            "route_armed": armed["armed"],
            "tests_missing": armed["missing"],
        },
        {"expected_share": c.expected_share, "p99_ms": c.p99_ms,
         "roundtrip_timeout_s": c.roundtrip_timeout_s},
        why="; ".join(problems) or "share, round trip and scoring cost as intended",
        route=route,
        pairs=source,
    )  # fmt: skip
