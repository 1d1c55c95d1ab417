"""Redis bytes per pair and per route: what the breaker keeps, measured on a real Redis.

Folds N shadow scores per route through the real ``RedisBreakerStore`` (the Lua
step, the pair_id dedupe keys) into a throwaway Redis of its own, and reads
``used_memory`` before and after plus ``MEMORY USAGE`` of the route's own keys.
The dedupe keys expire after ``worker.dedupe_ttl_s`` (default 3600 s): at a
steady rate R pairs/s a worker's Redis holds about R x 3600 of them, which is
the bound this prints.

    python bench/redis_bytes.py --pairs 20000 --routes 4 [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

import redis.asyncio as aioredis

from quantdrift.breaker.policy import RoutePolicy
from quantdrift.breaker.store import DEFAULT_SEEN_TTL_S, RedisBreakerStore
from quantdrift.schemas import Metrics, ScoreEvent
from quantdrift.schemas.keys import route_key
from quantdrift.schemas.signing import CommandSigner
from quantdrift.stack.redis_server import start_redis_server

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import write_section

SECTION = "## Redis bytes per pair and per route"


async def measure(url: str, pairs: int, routes: int) -> dict[str, float]:
    client = aioredis.Redis.from_url(url)
    store = RedisBreakerStore(client, CommandSigner("k", b"bench"), key_prefix="qd:")
    # Every pair passes: this measures what is kept per pair, not what a transition adds.
    policy = RoutePolicy(min_pairs=10**9)
    await client.flushall()
    before = (await client.info("memory"))["used_memory"]
    started = time.perf_counter()
    names = [f"bench-{i}/int4" for i in range(routes)]
    for n in range(pairs):
        route = names[n % routes]
        score = ScoreEvent(
            pair_id=f"req-{n:012d}-{n * 7919 % 100003:06d}",  # ~26 chars, like a request id
            route=route,
            kind="shadow",
            ts=float(n),
            decoding="greedy",
            metrics=Metrics(cosine=0.97, rougeL=0.8),
        )
        await store.fold(score, policy, now=float(n))
    elapsed = time.perf_counter() - started
    after = (await client.info("memory"))["used_memory"]
    state_bytes = [await client.memory_usage(route_key("qd:", r, "state")) or 0 for r in names]
    one_seen = await client.memory_usage(
        route_key("qd:", names[0], "seen:shadow:req-000000000000-000000")
    )
    await client.aclose()
    per_pair = (after - before - sum(state_bytes)) / pairs
    return {
        "pairs": pairs,
        "routes": routes,
        "redis_bytes_per_pair": round(per_pair, 1),
        "memory_usage_of_one_dedupe_key": int(one_seen or 0),
        "redis_bytes_per_route_state": round(sum(state_bytes) / routes, 1),
        "dedupe_ttl_s": DEFAULT_SEEN_TTL_S,
        "bound_mb_at_100_pairs_per_s": round(per_pair * 100 * DEFAULT_SEEN_TTL_S / 1e6, 1),
        "folds_per_s_one_connection": round(pairs / elapsed, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=20_000)
    parser.add_argument("--routes", type=int, default=4)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--write", type=Path, default=None)
    args = parser.parse_args()
    with start_redis_server() as server:
        result = asyncio.run(measure(server.url, args.pairs, args.routes))
    text = "\n".join(
        [
            SECTION,
            "",
            f"`python bench/redis_bytes.py --pairs {args.pairs} --routes {args.routes}`: "
            "shadow scores folded through the real Lua step into a Redis of its own.",
            "",
            "| bytes per pair | one dedupe key | per route's state | dedupe TTL "
            "| bound at 100 pairs/s | folds/s (one connection) |",
            "|---|---|---|---|---|---|",
            f"| {result['redis_bytes_per_pair']} | {result['memory_usage_of_one_dedupe_key']} "
            f"| {result['redis_bytes_per_route_state']} | {result['dedupe_ttl_s']} s "
            f"| {result['bound_mb_at_100_pairs_per_s']} MB "
            f"| {result['folds_per_s_one_connection']} |",
            "",
        ]
    )
    print(text)
    if args.write:
        write_section(args.write, text, SECTION)
    if args.json:
        print(json.dumps(result))


if __name__ == "__main__":
    main()
