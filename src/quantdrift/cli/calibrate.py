"""``quantdrift calibrate PAIRS.jsonl[.gz] [--route R] [--redis-url URL] [--key-prefix P]``.

Seeds the noise floor in Redis, per route and decoding mode, from the file's
``noise`` pairs (reference vs reference): they are scored like the worker
scores them, and each mode's floor is written with the breaker store's
compare-and-set (the keys the worker reads, ``{prefix}route:{ROUTE}:noise:MODE``).

Without ``--route`` each route calibrates from its own noise pairs; with
``--route R`` (repeatable) all the file's noise pairs calibrate R, e.g. the
lab's ``lab/noise`` pairs for a gateway's ``cs-agent/int4``. Greedy reference
runs are identical, so a mode without informative noise pairs borrows the
other mode's (see :mod:`quantdrift.evaluation.calibration`). The floor is
replaced unless ``--merge``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

from quantdrift.cli.score import EMBEDDERS


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("calibrate", help="seed the per-route noise floor in Redis from noise pairs")
    p.add_argument("pairs", type=Path, help="PairEvent JSONL(.gz) holding noise pairs")
    p.add_argument("--route", action="append", default=None, help="route to calibrate (repeat)")
    p.add_argument("--redis-url", default=None, help="default: settings or the running stack")
    p.add_argument("--key-prefix", default=None, help="default: settings (qd:)")
    p.add_argument("--embedder", choices=EMBEDDERS, default="minilm")
    p.add_argument("--merge", action="store_true", help="append to the floor instead of replacing")
    p.add_argument("--json", action="store_true", help="print one JSON object per floor written")
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
    noise = [p for p in read_pairs(args.pairs) if p.kind == "noise"]
    if not noise:
        return _fail(f"{args.pairs}: no noise pairs (kind = noise) to calibrate from")
    embedder = None
    if args.embedder == "minilm":
        from quantdrift.detectors import SentenceTransformerEmbedder

        e = settings.embedding
        embedder = SentenceTransformerEmbedder(model=e.model, batch_size=e.batch_size, threads=1)
    cache = ScoreCache(embedder)
    cache.fill(noise)
    by_route: dict[str, list] = {}  # type: ignore[type-arg]
    for route in args.route or dict.fromkeys(p.route for p in noise):
        rp = policy.for_route(route)
        mine = noise if args.route else [p for p in noise if p.route == route]
        by_route[route] = [to_score(p, cache[p], rp, route) for p in mine]
    rows = asyncio.run(
        _write(
            args.redis_url or redis_url(settings),
            args.key_prefix if args.key_prefix is not None else settings.redis.key_prefix,
            settings,
            {r: floor_seed(s, policy.for_route(r).min_noise_pairs) for r, s in by_route.items()},
            args.merge,
        )
    )
    for row in rows:
        if args.json:
            print(json.dumps(row))
        else:
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

    from quantdrift.breaker.store import RedisBreakerStore
    from quantdrift.config import Settings
    from quantdrift.schemas.signing import signer_from_settings

    assert isinstance(settings, Settings)
    signer = signer_from_settings(settings.signing.active_key_id, settings.signing.keys)
    client = aioredis.Redis.from_url(url, socket_timeout=5)
    store = RedisBreakerStore(client, signer, key_prefix=prefix)
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
