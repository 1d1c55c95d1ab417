"""Where a worker's time goes under load: py-spy on the worker process, top frames.

Starts the embedded stack and one warmed-up worker (``e2e.warm_loop``), publishes
long pairs at ``--rate`` for ``--seconds`` while ``py-spy record`` samples the
worker (all threads, native frames off), then prints the frames with the most
samples of their own (self time) and the most samples in total (inclusive).

    python bench/profile_worker.py [--rate 80] [--seconds 20] [--json] [--write FILE]
                                   [--stacks FILE]

``--stacks`` keeps py-spy's collapsed stacks, one ``frame;frame;... count`` per line,
so the callers of a hot frame can be read (``grep 'selector_events.py:1057'``).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import long_pairs, write_section
from e2e import relabel, warm_loop

SECTION = "## Worker profile (py-spy)"


def top_frames(collapsed: str, n: int) -> tuple[list[tuple[str, float]], list[tuple[str, float]]]:
    """(self, inclusive) shares of samples per frame, from py-spy's collapsed stacks."""
    own: collections.Counter[str] = collections.Counter()
    total: collections.Counter[str] = collections.Counter()
    samples = 0
    for line in collapsed.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        k = int(count)
        frames = stack.split(";")
        samples += k
        own[frames[-1]] += k
        for frame in set(frames):
            total[frame] += k
    if not samples:
        return [], []
    return (
        [(f, c / samples) for f, c in own.most_common(n)],
        [(f, c / samples) for f, c in total.most_common(n)],
    )


async def run(args: argparse.Namespace) -> dict[str, Any]:
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    async with warm_loop(seed=97) as (_, loop):
        assert loop.worker.pid is not None
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "worker.txt"
            recorder = subprocess.Popen(
                [
                    spy, "record", "--pid", str(loop.worker.pid), "--duration",
                    str(int(args.seconds)), "--rate", "100", "--format", "raw",
                    "--output", str(out), "--nonblocking",
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
            )  # fmt: skip
            pool = relabel(long_pairs(int(args.rate * args.seconds) + 10, seed=5), "prof")
            t0 = time.monotonic()
            for i, pair in enumerate(pool):
                if time.monotonic() - t0 >= args.seconds:
                    break
                await loop.publish(pair)
                delay = t0 + (i + 1) / args.rate - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
            await asyncio.to_thread(recorder.wait, 60)
            if recorder.returncode != 0 or not out.exists():
                err = recorder.stderr.read().decode() if recorder.stderr else ""
                raise RuntimeError(f"py-spy failed ({recorder.returncode}): {err[-500:]}")
            collapsed = out.read_text()
            if args.stacks is not None:
                args.stacks.write_text(collapsed)
            self_top, incl_top = top_frames(collapsed, args.top)
    return {
        "bench": "profile_worker",
        "rate_pairs_per_s": args.rate,
        "seconds": args.seconds,
        "self": [(f, round(s, 4)) for f, s in self_top],
        "inclusive": [(f, round(s, 4)) for f, s in incl_top],
    }


def markdown(result: dict[str, Any]) -> str:
    def rows(items: list[tuple[str, float]]) -> list[str]:
        return [f"| {100 * share:.1f} % | `{frame}` |" for frame, share in items]

    return "\n".join(
        [
            SECTION,
            "",
            f"`python bench/profile_worker.py --rate {result['rate_pairs_per_s']:g} --seconds "
            f"{result['seconds']:g}`: py-spy samples one worker (every thread, 100 Hz) while "
            "long pairs arrive at that rate. Shares are of all samples, idle threads included.",
            "",
            "Most samples of their own (self):",
            "",
            "| share | frame |",
            "|---:|---|",
            *rows(result["self"]),
            "",
            "Most samples including callees (inclusive):",
            "",
            "| share | frame |",
            "|---:|---|",
            *rows(result["inclusive"]),
            "",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=float, default=80.0)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--write", type=Path, default=None)
    ap.add_argument("--stacks", type=Path, default=None, help="keep the collapsed stacks here")
    args = ap.parse_args(argv)
    result = asyncio.run(run(args))
    print(markdown(result))
    if args.write:
        write_section(args.write, markdown(result), SECTION)
    if args.json:
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
