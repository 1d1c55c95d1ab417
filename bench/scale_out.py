"""Scale out: one worker, then two in the same group, on a topic with 4 partitions.

Each measurement is a burst of long pairs (``common.long_pairs``, ~200 tokens a
side, on ``--routes`` routes: 4 by default, or 1, the hot route whose pairs the
pairs topic spreads over its partitions by pair id) timed from the first send to
the last ScoreEvent, as ``bench/e2e.py``'s capacity. The second worker
joins the group, warms up its model, and the group settles before the second
burst. On this 2-core machine the producer, the score reader, Tansu and Redis
share the cores with the workers, which is the first limit beyond two workers.

    python bench/scale_out.py [--pairs 600] [--routes 4] [--json] [--write BENCHMARKS.md]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import finish, long_pairs
from e2e import Loop, bench_settings, relabel

from quantdrift.demo.workers import WorkerProcess
from quantdrift.stack import EmbeddedStack
from quantdrift.stack.broker import create_topics

SECTION = "## Scale out: two workers on two cores"
PARTITIONS = 4


async def warm(loop: Loop, tag: str, n: int, seed: int, routes: int, timeout: float = 240) -> None:
    pairs = relabel(long_pairs(n, seed=seed, routes=routes), tag)
    for p in pairs:
        await loop.publish(p)
    if not await loop.wait_scored([p.pair_id for p in pairs], timeout=timeout):
        raise RuntimeError(f"{tag}: warm-up pairs were not scored")


async def burst(loop: Loop, tag: str, n: int, seed: int, routes: int) -> dict[str, Any]:
    """Pairs/s on a burst of n long pairs, first send to last ScoreEvent (fresh ids)."""
    pairs = relabel(long_pairs(n, seed=seed, routes=routes), tag)
    t0 = time.monotonic()
    for p in pairs:
        await loop.publish(p)
    await loop.producer.flush()
    ids = [p.pair_id for p in pairs]
    if not await loop.wait_scored(ids, timeout=300):
        done = sum(i in loop.scored_at for i in ids)
        raise RuntimeError(f"{tag}: only {done}/{n} scored in 300 s")
    elapsed = max(loop.scored_at[i] for i in ids) - t0
    return {"pairs": n, "seconds": round(elapsed, 2), "pairs_per_s": round(n / elapsed, 1)}


async def run(args: argparse.Namespace) -> dict[str, Any]:
    with EmbeddedStack(redis_probe_url=None) as stack:
        settings = bench_settings(stack, partitions=PARTITIONS)
        await create_topics(
            stack.bootstrap, settings.kafka.topics.model_dump().values(), PARTITIONS
        )
        first = WorkerProcess(settings, stack.redis_url).start()
        loop = Loop(settings, first)
        second: WorkerProcess | None = None
        try:
            await loop.start()
            await warm(loop, "warm1", 16, seed=900, routes=args.routes)
            one = await burst(loop, "one", args.pairs, seed=args.seed, routes=args.routes)
            second = WorkerProcess(settings, stack.redis_url).start()
            # The group rebalances onto both workers and the new one loads its model:
            # keep a trickle flowing until it has settled, then measure.
            t0 = time.monotonic()
            rounds = 0
            while time.monotonic() - t0 < args.settle_s:
                rounds += 1
                await warm(loop, f"settle{rounds}", 8, seed=900 + rounds, routes=args.routes)
                if not second.alive():
                    raise RuntimeError("second worker died:\n" + second.log_tail())
            two = await burst(loop, "two", args.pairs, seed=args.seed + 1, routes=args.routes)
        finally:
            await loop.stop()
            first.stop()
            if second is not None:
                second.stop()
    return {
        "bench": "scale_out",
        "partitions": PARTITIONS,
        "routes": args.routes,
        "one_worker": one,
        "two_workers": two,
        "speedup": round(two["pairs_per_s"] / one["pairs_per_s"], 2),
    }


def markdown(result: dict[str, Any]) -> str:
    one, two = result["one_worker"], result["two_workers"]
    routes = result.get("routes", PARTITIONS)
    return "\n".join(
        [
            SECTION,
            "",
            f"`python bench/scale_out.py --pairs {one['pairs']} --routes {routes}`: a burst of "
            f"{one['pairs']} long pairs on {routes} route{'s' if routes > 1 else ''}, over "
            f"{result['partitions']} partitions (pairs are keyed by pair id), first send to "
            "last ScoreEvent.",
            "",
            "| workers | pairs/s | seconds |",
            "|---|---|---|",
            f"| 1 | {one['pairs_per_s']} | {one['seconds']} |",
            f"| 2 | {two['pairs_per_s']} | {two['seconds']} |",
            "",
            f"Speed-up: **{result['speedup']}×** (target ≥ 1.8×). Beyond two workers on this "
            "machine the cores are the limit: the producer, the score reader, Tansu and Redis "
            "run on the same two cores as the workers.",
            "",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=600)
    ap.add_argument("--routes", type=int, default=PARTITIONS, help="1: one hot route")
    ap.add_argument("--settle-s", type=float, default=20.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--write", type=Path, default=None)
    args = ap.parse_args(argv)
    result = asyncio.run(run(args))
    return finish(result, markdown(result), args.write, SECTION, args.json)


if __name__ == "__main__":
    raise SystemExit(main())
