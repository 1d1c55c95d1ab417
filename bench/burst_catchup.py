"""Does a worker that falls far behind catch up? A backlog published at once, then waited on.

A soak suspect: after a slow stretch the worker's consumer may pause fetching
(its stream buffer full) and never resume. This publishes ``N`` long pairs as
fast as the broker takes them and waits until every one is scored; if nothing
is scored for 45 s it runs the soak's stall probe (``bench/soak.stall_probe``)
and keeps the worker's log.

    python bench/burst_catchup.py [N] [--worker-log FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import long_pairs
from e2e import relabel, warm_loop
from soak import stall_probe

STALL_S = 45.0


async def run(n: int, worker_log: Path | None) -> bool:
    """True when all ``n`` pairs were scored; False after a stall (probed)."""
    async with warm_loop(seed=98, log_level="info") as (_, loop):
        pool = relabel(long_pairs(2000, seed=0), "burst")
        t0 = time.monotonic()
        for i in range(n):
            await loop.publish(pool[i % len(pool)].model_copy(update={"pair_id": f"burst-{i}"}))
        await loop.producer.flush()
        print(f"published {n} in {time.monotonic() - t0:.1f} s", flush=True)
        last, last_t = -1, time.monotonic()
        try:
            while True:
                done = sum(1 for k in loop.scored_at if k.startswith("burst-"))
                if done >= n:
                    print(f"all {n} scored after {time.monotonic() - t0:.1f} s")
                    return True
                if done != last:
                    last, last_t = done, time.monotonic()
                elif time.monotonic() - last_t > STALL_S:
                    print(f"stalled at {done} of {n}", flush=True)
                    await stall_probe(loop, loop.worker.pid, time.monotonic() - t0)
                    return False
                await asyncio.sleep(1)
        finally:
            if worker_log is not None:
                worker_log.write_bytes(loop.worker.log_path.read_bytes())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("n", type=int, nargs="?", default=12000)
    ap.add_argument("--worker-log", type=Path, default=None)
    args = ap.parse_args(argv)
    return 0 if asyncio.run(run(args.n, args.worker_log)) else 1


if __name__ == "__main__":
    raise SystemExit(main())
