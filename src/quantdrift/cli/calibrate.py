"""``quantdrift calibrate PAIRS.jsonl[.gz] [--route R] [--redis-url URL] [--key-prefix P]``.

Seeds the noise floor in Redis, per route and decoding mode, from the file's
``noise`` pairs (reference vs reference): they are scored like the worker
scores them, and each mode's floor is written with the breaker store's
compare-and-set (``BreakerStore.seed_floor``, which ``quantdrift eval`` calls on its
in-memory store; the keys the worker reads, ``{prefix}route:{ROUTE}:noise:MODE``).

Without ``--route`` each route calibrates from its own noise pairs; with
``--route R`` (repeatable) all the file's noise pairs calibrate R, e.g. the
lab's ``lab/noise`` pairs for a gateway's ``cs-agent/int4``. Each mode's floor
comes from that mode's pairs only: identical greedy runs say nothing, and a
greedy floor is never borrowed from sampled pairs. ``--blessed-label L`` adds
the file's shadow pairs of candidate L (a candidate run the operator approved:
the pair's label, or, for a gateway's pairs, which carry none, the candidate's
precision, served model name or engine identity) as the blessed baseline,
which the tolerance rule prefers for every metric where
it is informative (see :mod:`quantdrift.evaluation.calibration`). ``--part
calibration`` keeps only the prompts of that part of the lab's split. The
floor is replaced unless ``--merge``. ``--embedder`` builds exactly the scorer
it names (default: the worker's).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

EMBEDDERS = ("minilm", "tiered", "static", "none")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("calibrate", help="seed the per-route noise floor in Redis from noise pairs")
    p.add_argument("pairs", type=Path, help="PairEvent JSONL(.gz) holding noise pairs")
    p.add_argument("--route", action="append", default=None, help="route to calibrate (repeat)")
    p.add_argument("--redis-url", default=None, help="default: settings or the running stack")
    p.add_argument("--key-prefix", default=None, help="default: settings (qd:)")
    p.add_argument(
        "--embedder", choices=EMBEDDERS, default=None, help="default: the worker's scorer"
    )
    p.add_argument(
        "--blessed-label",
        default=None,
        help="the blessed baseline: shadow pairs whose label, candidate precision, served model "
        "or engine identity (vllm/0.32.0/int8) is one of these, comma-separated",
    )
    p.add_argument("--part", choices=("calibration", "evaluation"), default=None)
    p.add_argument("--merge", action="store_true", help="append to the floor instead of replacing")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.add_argument(
        "--json", action="store_true", help="print one JSON array: an object per floor written"
    )
    p.set_defaults(func=run)


def _fail(message: str) -> int:
    sys.stderr.write(f"quantdrift: error: {message}\n")
    return 2


def run(args: argparse.Namespace) -> int:
    from quantdrift.breaker.policy import load_policy
    from quantdrift.cli.common import load_settings, redis_url, with_stack
    from quantdrift.demo.sources import read_pairs
    from quantdrift.evaluation import ScoreCache, floor_seed, to_score

    if not args.pairs.exists():
        return _fail(f"no such file: {args.pairs}")
    if args.route and any(not r for r in args.route):
        return _fail("--route must not be empty")
    settings = with_stack(load_settings())
    policy = load_policy(settings.policy_file)
    from quantdrift.evaluation.modes import select
    from quantdrift.services.scoring import build_embedder

    pairs = select(read_pairs(args.pairs), part=args.part)
    noise = [p for p in pairs if p.kind == "noise"]
    labels = tuple(v.strip() for v in (args.blessed_label or "").split(",") if v.strip())
    blessed = select(pairs, labels=labels, kinds=("shadow",)) if labels else []
    if not noise and not blessed:
        return _fail(f"{args.pairs}: no noise pairs (kind = noise) or blessed pairs")
    embedder, _tier = build_embedder(settings.embedding, args.embedder)
    from quantdrift.cli.progress import self_closing

    cache = ScoreCache(embedder, progress=self_closing(not args.no_progress, "score pairs"))
    cache.fill([*noise, *blessed])
    seeds = {}
    for route in args.route or dict.fromkeys(p.route for p in [*noise, *blessed]):
        rp = policy.for_route(route)
        mine = noise if args.route else [p for p in noise if p.route == route]
        good = blessed if args.route else [p for p in blessed if p.route == route]
        seeds[route] = floor_seed(
            [to_score(p, cache[p], rp, route) for p in mine],
            rp.min_noise_pairs,
            [to_score(p, cache[p], rp, route) for p in good],
        )
    rows = asyncio.run(
        _write(
            args.redis_url or redis_url(settings),
            args.key_prefix if args.key_prefix is not None else settings.redis.key_prefix,
            settings,
            seeds,
            args.merge,
        )
    )
    if args.json:
        print(json.dumps(rows))
        return 0
    for row in rows:
        print(
            f"{row['route']} {row['mode']}: {row['seeded']} noise pairs "
            f"({row['source']}), floor now {row['floor_pairs']}"
        )
    return 0


async def _write(
    url: str,
    prefix: str,
    settings: object,
    seeds: dict[str, tuple[dict[str, list[dict[str, float]]], dict[str, str]]],
    merge: bool,
) -> list[dict[str, object]]:
    import redis.asyncio as aioredis

    from quantdrift.breaker.protocol import BreakerStore
    from quantdrift.breaker.store import RedisBreakerStore
    from quantdrift.config import Settings
    from quantdrift.schemas.signing import signer_from_settings

    assert isinstance(settings, Settings)
    signer = signer_from_settings(settings.signing.active_key_id, settings.signing.keys)
    client = aioredis.Redis.from_url(url, socket_timeout=5)
    # The floor eval seeds its memory store with, written through the same protocol.
    store: BreakerStore = RedisBreakerStore(client, signer, key_prefix=prefix)
    rows: list[dict[str, object]] = []
    try:
        for route, (seed, source) in seeds.items():
            for mode, values in seed.items():
                if not values:
                    continue
                state = await store.seed_floor(route, mode, values, merge=merge)
                rows.append(
                    {
                        "route": route,
                        "mode": mode,
                        "seeded": len(values),
                        "source": source[mode],
                        "floor_pairs": max((state.count(m) for m in state.values), default=0),
                    }
                )
    finally:
        await client.aclose()
    return rows
