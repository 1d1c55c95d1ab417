"""Soak: one worker at the rated load for N minutes; its RSS sampled, flat or growing?

The worker's resident memory (psutil, ``/proc`` underneath) is sampled every
``--sample-s`` seconds while long pairs (``bench/common.long_pairs``) are
published at ``--rate`` pairs/s. The slope is a least-squares fit over the
samples after the first minute (model load, caches and the allocator settle
first), reported in MB per minute and per 10,000 pairs. Redis memory is
reported too: the dedupe keys (one per pair, expiring after ``worker.dedupe_ttl_s``,
1 h) are what grows there, and the soak reports Redis bytes per pair scored and
the RSS of the broker (Tansu) and Redis processes when it started them.

    python bench/soak.py [--minutes 10] [--rate R] [--factor 1.5] [--json] [--write FILE]

Every producer, the load generator's and the worker's, lingers ``--linger-ms`` (100 by
default, the project's default is 5) so that the embedded broker holds batches of a few
pairs, not one batch per pair. Tansu 0.6's memory storage keeps one object per batch
and answers every fetch of new data by listing all of the partition's objects
(``DynoStore::fetch``, ``tansu-storage/src/dynostore.rs``); it implements no retention
and no DeleteRecords. Its CPU per fetch therefore grows with the batches it holds, and
at one batch per pair a soak of 90 pairs/s saturates a core within minutes and stops
feeding the worker (BENCHMARKS.md, "The stall"). Batches of a few pairs divide that
growth by their size and by the fetches they save; the broker's CPU is sampled
(``broker_cpu``) so a run shows whether it stayed bounded. Apache Kafka indexes its
segments and needs none of this.

Without ``--rate`` the rated load comes from the paced ramp of ``bench/e2e.py``;
``--factor`` multiplies the load (``make bench-long`` runs 1.5x for ``MINUTES``,
30 by default; the launch standard asks for 4 hours: ``make bench-long MINUTES=240``).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import redis.asyncio as aioredis
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import finish, long_pairs
from e2e import (
    RAMP_RATES,
    SCORE_P99_TARGET_MS,
    percentile,
    ramp,
    ramp_processes,
    rated_load,
    relabel,
    warm_loop,
)

SECTION = "## Memory soak"
SETTLE_S = 60.0
PROBE_AFTER_S = 30.0
"""Nothing scored this long while pairs wait: probe the worker once (stack, offsets)."""


def slope_per_min(samples: list[tuple[float, float]]) -> float | None:
    """Least-squares slope of (seconds, MB) in MB/min; None for fewer than 3 samples."""
    if len(samples) < 3:
        return None
    n = len(samples)
    mx = sum(t for t, _ in samples) / n
    my = sum(v for _, v in samples) / n
    sxx = sum((t - mx) ** 2 for t, _ in samples)
    if sxx == 0:
        return None
    sxy = sum((t - mx) * (v - my) for t, v in samples)
    return sxy / sxx * 60


async def redis_used_mb(url: str) -> float:
    client = aioredis.Redis.from_url(url)
    try:
        info = await client.info("memory")
    finally:
        await client.aclose()
    return float(info["used_memory"]) / 1e6


async def run(args: argparse.Namespace) -> dict[str, Any]:
    loop_cm = warm_loop(seed=98, log_level=args.worker_log_level, linger_ms=args.linger_ms)
    async with loop_cm as (stack, loop):
        worker = loop.worker
        cap = None
        rate = args.rate
        if rate is None:
            pids = ramp_processes(stack, loop)
            cap = await ramp(loop, RAMP_RATES, 10.0, 20.0, seed=args.seed + 7, pids=pids)
            rate = rated_load(cap)
        rate = rate * args.factor
        assert worker.pid is not None
        servers = _server_processes(stack)
        server_rss: dict[str, list[float]] = {name: [] for name in servers}
        # The broker's CPU share per sample: the stall's cause (see _broker_note).
        broker_cpu: list[tuple[float, float]] = []
        broker = servers.get("tansu")
        broker_cpu_at = (time.monotonic(), sum(broker.cpu_times()[:2])) if broker else None
        proc = psutil.Process(worker.pid)
        duration = args.minutes * 60
        pool = relabel(long_pairs(2000, seed=args.seed), "soak")
        samples: list[tuple[float, float]] = []
        # (seconds, pairs sent, pairs scored): tells a worker that slows from one that stops.
        progress: list[tuple[float, int, int]] = []
        redis_start = await redis_used_mb(stack.redis_url)
        probe: dict[str, Any] | None = None
        t0 = time.monotonic()
        next_sample = t0
        sent = 0
        while True:
            now = time.monotonic()
            if now - t0 >= duration:
                break
            if now >= next_sample:
                samples.append((now - t0, proc.memory_info().rss / 1e6))
                progress.append((now - t0, sent, _scored(loop)))
                for name, server in servers.items():
                    server_rss[name].append(server.memory_info().rss / 1e6)
                if broker is not None and broker_cpu_at is not None:
                    cpu_now = sum(broker.cpu_times()[:2])
                    share = (cpu_now - broker_cpu_at[1]) / max(1e-9, now - broker_cpu_at[0])
                    broker_cpu.append((now - t0, share))
                    broker_cpu_at = (now, cpu_now)
                next_sample += args.sample_s
                if not worker.alive():
                    raise RuntimeError("worker died:\n" + worker.log_tail())
                if probe is None and stalled_for(progress) >= PROBE_AFTER_S:
                    probe = await stall_probe(loop, worker.pid, now - t0)
            base = pool[sent % len(pool)]
            # Fresh ids: a repeated id would be a dedupe hit, not work.
            pair = base.model_copy(update={"pair_id": f"soak-{sent}"})
            # Open loop: latency counts from the scheduled send time.
            await loop.publish(pair, at=t0 + sent / rate)
            sent += 1
            delay = t0 + sent / rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
        await loop.producer.flush()
        samples.append((time.monotonic() - t0, proc.memory_info().rss / 1e6))
        ids = [f"soak-{i}" for i in range(max(0, sent - 50), sent)]
        await loop.wait_scored(ids, timeout=30)
        scored = _scored(loop)
        progress.append((time.monotonic() - t0, sent, scored))
        reader_failure = loop.reader_failure()
        worker_log = worker.log_tail(20_000).splitlines()
        lat = [
            (loop.scored_at[k] - loop.sent_at[k]) * 1000
            for k in loop.scored_at
            if k.startswith("soak-") and k in loop.sent_at
        ]
        redis_end = await redis_used_mb(stack.redis_url)
        if args.worker_log is not None:
            args.worker_log.write_bytes(worker.log_path.read_bytes())
    settled = [s for s in samples if s[0] >= min(SETTLE_S, duration / 3)]
    slope = slope_per_min(settled)
    rss = [v for _, v in samples]
    per_10k = None if slope is None else slope / (rate * 60) * 10_000
    return {
        "bench": "soak",
        "minutes": args.minutes,
        "rate_pairs_per_s": rate,
        "linger_ms": args.linger_ms,
        "capacity": cap,
        "pairs_sent": sent,
        "pairs_scored": scored,
        "score_p50_ms": None if not lat else round(percentile(lat, 50) or 0, 1),
        "score_p99_ms": None if not lat else round(percentile(lat, 99) or 0, 1),
        "rss_mb_start": round(rss[0], 1),
        "rss_mb_after_settle": round(settled[0][1], 1) if settled else None,
        "rss_mb_end": round(rss[-1], 1),
        "rss_mb_max": round(max(rss), 1),
        "rss_slope_mb_per_min": None if slope is None else round(slope, 3),
        "rss_slope_mb_per_10k_pairs": None if per_10k is None else round(per_10k, 3),
        "redis_mb_growth": round(redis_end - redis_start, 2),
        "redis_bytes_per_pair": round((redis_end - redis_start) * 1e6 / scored, 1)
        if scored
        else None,
        "factor": args.factor,
        "server_rss_mb": {
            name: {"start": round(v[0], 1), "end": round(v[-1], 1), "max": round(max(v), 1)}
            for name, v in server_rss.items()
            if v
        },
        "samples": [(round(t, 1), round(v, 1)) for t, v in samples],
        "progress": [(round(t, 1), n_sent, n_scored) for t, n_sent, n_scored in progress],
        "longest_stall_s": longest_stall(progress),
        "stall_probe": probe,
        "score_reader_failure": reader_failure,
        "worker_warnings": [line for line in worker_log if "WARNING" in line or "ERROR" in line][
            -10:
        ],
        "broker_mb_per_10k_pairs": _broker_per_10k(server_rss, sent),
        # (seconds, cores the broker used since the sample before)
        "broker_cpu": [(round(t, 1), round(c, 2)) for t, c in broker_cpu[1:]],
    }


def _scored(loop: Any) -> int:
    return sum(1 for k in loop.scored_at if k.startswith("soak-"))


def _stalls(progress: list[tuple[float, int, int]]) -> tuple[float, float]:
    """(longest, ongoing) time in s that nothing new was scored while pairs were waiting.

    One walk over the samples: ``longest`` for the report, ``ongoing`` (the stall
    still open at the last sample, 0 if none) to probe a stall while it happens.
    """
    longest, since = 0.0, None
    for (t0, _, done0), (t1, sent1, done1) in itertools.pairwise(progress):
        if done1 == done0 and sent1 > done1:
            since = t0 if since is None else since
            longest = max(longest, t1 - since)
        else:
            since = None
    ongoing = 0.0 if since is None else progress[-1][0] - since
    return round(float(longest), 1), float(ongoing)


def longest_stall(progress: list[tuple[float, int, int]]) -> float:
    """Longest time (s) nothing new was scored while pairs were waiting.

    A worker that is slow still scores something in every sample; one that
    stopped (left its group, blocked, or the score reader died) does not.

    >>> longest_stall([(0, 10, 10), (5, 20, 15), (10, 30, 15), (15, 40, 15), (20, 40, 40)])
    10.0
    """
    return _stalls(progress)[0]


def stalled_for(progress: list[tuple[float, int, int]]) -> float:
    """How long (s) nothing new has been scored, at the last sample, while pairs wait.

    >>> stalled_for([(0, 10, 10), (5, 20, 15), (10, 30, 15), (15, 40, 15)])
    10.0
    >>> stalled_for([(0, 10, 10), (5, 20, 20)])
    0.0
    """
    return _stalls(progress)[1]


async def stall_probe(loop: Any, pid: int | None, at_s: float) -> dict[str, Any]:
    """What a stall looks like from outside: where each thread is, and where the offsets are.

    Three questions tell the suspects apart: did the worker stop *committing*
    pairs (its group's offsets on the pairs topic), did it stop *sending* scores
    (the scores topic's end offsets against what this bench's reader saw), and
    what is each of its threads doing (a ``py-spy dump`` of the live process).
    """
    topics = loop.settings.kafka.topics
    group = loop.settings.worker.app_id
    out: dict[str, Any] = {"at_s": round(at_s, 1), "reader_saw": len(loop.scored_at)}
    consumer = AIOKafkaConsumer(bootstrap_servers=loop.settings.kafka.bootstrap_servers)
    admin = AIOKafkaAdminClient(bootstrap_servers=loop.settings.kafka.bootstrap_servers)
    try:
        await consumer.start()
        await admin.start()
        await consumer.topics()  # metadata: an unsubscribed consumer knows no partitions yet
        for name in (topics.pairs, topics.scores):
            parts = [TopicPartition(name, p) for p in consumer.partitions_for_topic(name) or ()]
            ends = await consumer.end_offsets(parts)
            out[f"{name} end"] = {tp.partition: off for tp, off in ends.items()}
        committed = await admin.list_consumer_group_offsets(group)
        out["group committed"] = {
            f"{tp.topic}[{tp.partition}]": meta.offset for tp, meta in committed.items()
        }
    except Exception as exc:  # a probe must not end the soak it is explaining
        out["offsets_error"] = repr(exc)
    finally:
        await consumer.stop()
        await admin.close()
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if pid is not None and Path(spy).exists():
        proc = await asyncio.create_subprocess_exec(
            spy,
            "dump",
            "--pid",
            str(pid),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        try:
            dump, _ = await asyncio.wait_for(proc.communicate(), 30)
            out["py_spy_dump"] = dump.decode(errors="replace")
        except TimeoutError:
            proc.kill()
            out["py_spy_dump"] = "py-spy dump timed out"
    print(json.dumps(out, indent=1), file=sys.stderr, flush=True)
    return out


def _broker_per_10k(server_rss: dict[str, list[float]], sent: int) -> float | None:
    """The broker's growth per 10k pairs: Tansu's memory storage keeps every record."""
    v = server_rss.get("tansu")
    if not v or not sent:
        return None
    return round((v[-1] - v[0]) / sent * 10_000, 1)


def _server_processes(stack: Any) -> dict[str, psutil.Process]:
    """The broker and Redis processes this run started (the machine's Redis is not ours)."""
    out: dict[str, psutil.Process] = {}
    for name, part in (("tansu", getattr(stack, "broker", None)), ("redis", stack.redis)):
        pid = getattr(part, "pid", None)
        if pid:
            try:
                out[name] = psutil.Process(pid)
            except psutil.Error:
                continue
    return out


def markdown(result: dict[str, Any]) -> str:
    slope = result["rss_slope_mb_per_min"]
    settled = result["rss_mb_after_settle"]
    if slope is None or settled is None:
        verdict = "too short to fit a slope"
    else:
        # Flat: what the fitted slope would change over an hour is under 5 % of the RSS.
        if abs(slope) * 60 < 0.05 * settled:
            verdict = "flat"
        else:
            verdict = "growing" if slope > 0 else "shrinking (still settling: run longer)"
    return "\n".join(
        [
            SECTION,
            "",
            f"One worker, {result['minutes']:g} min at {result['rate_pairs_per_s']:g} pairs/s "
            f"({_load(result.get('factor', 1.0))}; producers linger "
            f"{result.get('linger_ms', 5)} ms, see the "
            f"module docstring), {result['pairs_sent']} pairs sent, {result['pairs_scored']} "
            f"scored; pair→ScoreEvent from the scheduled send time p50 "
            f"{result['score_p50_ms']} ms, **p99 {result['score_p99_ms']} ms** (target < "
            f"{SCORE_P99_TARGET_MS:g} ms)." + _behind(result),
            "",
            "| RSS start | after settling | end | max | slope | per 10k pairs | Redis growth |",
            "|---|---|---|---|---|---|---|",
            f"| {result['rss_mb_start']} MB | {settled} MB | {result['rss_mb_end']} MB "
            f"| {result['rss_mb_max']} MB | {slope} MB/min "
            f"| {result['rss_slope_mb_per_10k_pairs']} MB | {result['redis_mb_growth']} MB |",
            "",
            f"Verdict: **{verdict}** (flat = the fitted slope adds < 5 % of RSS per hour; "
            f"fitted after the first {SETTLE_S:.0f} s). Redis grows by design: one dedupe key "
            f"per pair, expiring after `worker.dedupe_ttl_s` (1 h): "
            f"{result['redis_bytes_per_pair']} bytes per pair scored in this run.",
            "",
            *(
                f"- {name} RSS: {v['start']} MB at the start, {v['end']} MB at the end, "
                f"{v['max']} MB at most."
                for name, v in result["server_rss_mb"].items()
            ),
            "",
            _broker_note(result),
            "",
        ]
    )


def _load(factor: float) -> str:
    """How the rate relates to the rating: the soak runs 1.5x it for ``make bench-long``."""
    return "the rated load" if factor == 1.0 else f"{factor:g}x the rated load"


def _broker_note(result: dict[str, Any]) -> str:
    """The embedded broker's memory is not bounded by retention: say so, with the rate."""
    per_10k = result.get("broker_mb_per_10k_pairs")
    if per_10k is None:
        return ""
    per_hour = per_10k * result["rate_pairs_per_s"] * 3600 / 10_000
    note = (
        f"The embedded broker (Tansu 0.6, memory storage) keeps every record: it ignores "
        f"`retention.ms` and does not implement DeleteRecords, so no retention setting "
        f"bounds it; it grew {per_10k} MB per 10k pairs here, about {per_hour:.0f} MB per "
        f"hour at this rate. Long soaks need a broker with disk storage and retention "
        f"(Apache Kafka, `docker-compose.yml`)."
    )
    cpu = result.get("broker_cpu") or []
    if cpu:
        tenth = max(1, len(cpu) // 10)
        first = sum(c for _, c in cpu[:tenth]) / tenth
        peak_t, peak = max(cpu, key=lambda tc: tc[1])
        note += (
            f" Its CPU: {first:.2f} cores over the first tenth of the run, "
            f"{peak:.2f} at most (at {peak_t:g} s). It spends more per fetch the more records "
            f"it holds (`bench/broker_memory.py`), so at a fixed rate it saturates a core "
            f"after a while, and then nothing reaches the worker (docs/scaling.md, "
            f'"The embedded broker\'s limit", has the evidence).'
        )
    return note


def _behind(result: dict[str, Any]) -> str:
    """Say so when the worker did not keep up, and whether it slowed or stopped."""
    sent, scored = result["pairs_sent"], result["pairs_scored"]
    if not sent or scored >= 0.98 * sent:
        return ""
    stall = result.get("longest_stall_s") or 0.0
    failure = result.get("score_reader_failure")
    if failure:
        how = f" The bench's score reader died ({failure}): the count stops there."
    elif stall >= 30:
        how = (
            f" Nothing was scored for {stall:g} s while pairs waited: the worker stopped "
            "(not slowed); its last warnings are in the JSON (`worker_warnings`)."
        )
    else:
        sustained = scored / (result["minutes"] * 60)
        how = f" It kept scoring throughout, about {sustained:.0f} pairs/s: slower, not stopped."
    return f" **The worker fell behind**: {scored / sent:.0%} scored by the end.{how}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--rate", type=float, default=None, help="pairs/s (default: e2e's paced ramp)")
    ap.add_argument("--sample-s", type=float, default=5.0)
    ap.add_argument("--factor", type=float, default=1.0, help="multiply the rated load")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--linger-ms",
        type=int,
        default=100,
        help="every producer's linger: batches bound the embedded broker's fetch cost",
    )
    ap.add_argument("--json", action="store_true", help="end with one JSON object")
    ap.add_argument("--worker-log", type=Path, default=None, help="keep the worker's log here")
    ap.add_argument("--worker-log-level", default="warning", help="the worker's --log-level")
    ap.add_argument("--write", type=Path, default=None, help="write/update a section in this file")
    args = ap.parse_args(argv)
    result = asyncio.run(run(args))
    return finish(result, markdown(result), args.write, SECTION, args.json)


if __name__ == "__main__":
    raise SystemExit(main())
