"""Where a worker's time goes under load: py-spy on the worker process, top frames.

Starts the embedded stack and one warmed-up worker (``e2e.warm_loop``), publishes
long pairs at ``--rate`` for ``--seconds`` while ``py-spy record`` samples the
worker (all threads, native frames off), then prints the frames with the most
samples of their own (self time) and the most samples in total (inclusive).

    python bench/profile_worker.py [--rate 80] [--seconds 20] [--json] [--write FILE]
                                   [--stacks FILE] [--dtype bfloat16]
                                   [--also-dtype bfloat16]

``--stacks`` keeps py-spy's collapsed stacks, one ``frame;frame;... count`` per line,
so the callers of a hot frame can be read (``grep 'selector_events.py:1057'``).

A sample says where a thread *was*, not that it ran: a thread preempted in a
socket write (the loopback send woke Redis or the broker on the same core) is
sampled there all the same. So the run also reads the kernel's own accounts of
each worker thread over the window, ``/proc/<pid>/task/<tid>/schedstat`` (ns on
a CPU, ns runnable but waiting for one): CPU per pair is the first, summed.
``--rate 0`` publishes nothing, which measures what an idle worker burns.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import finish, long_pairs, native_bf16
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


def thread_clock(pid: int) -> dict[int, tuple[str, int, int]]:
    """tid -> (name, ns on a CPU, ns waiting on a run queue), from the kernel."""
    out: dict[int, tuple[str, int, int]] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            name = (task / "comm").read_text().strip()
            run_ns, wait_ns, _ = (task / "schedstat").read_text().split()
        except (OSError, ValueError):
            continue  # the thread ended between the listing and the read
        out[int(task.name)] = (name, int(run_ns), int(wait_ns))
    return out


_DUMP_THREAD = re.compile(r'^Thread (\d+) \(\w+\): "(.*)"$', re.MULTILINE)


def python_thread_names(spy: str, pid: int) -> dict[int, str]:
    """tid -> Python thread name, from ``py-spy dump``: on Python 3.11 every thread's
    kernel name (comm) is the process's, so the kernel's table alone cannot say which
    thread is the event loop and which the scorer."""
    dump = subprocess.run(
        [spy, "dump", "--nonblocking", "--pid", str(pid)], capture_output=True, text=True
    )
    # The main thread's tid is the pid, whether or not the dump caught it.
    return {pid: "MainThread"} | {int(t): n for t, n in _DUMP_THREAD.findall(dump.stdout)}


def thread_deltas(
    before: dict[int, tuple[str, int, int]],
    after: dict[int, tuple[str, int, int]],
    names: dict[int, str] | None = None,
) -> list[dict[str, Any]]:
    """Per thread that ran in the window: CPU seconds and run-queue wait seconds."""
    rows = []
    for tid, (comm, run_ns, wait_ns) in after.items():
        name = (names or {}).get(tid, comm)
        _, run0, wait0 = before.get(tid, (name, 0, 0))
        cpu, wait = (run_ns - run0) / 1e9, (wait_ns - wait0) / 1e9
        if cpu > 0.005 or wait > 0.005:
            rows.append(
                {"tid": tid, "name": name, "cpu_s": round(cpu, 3), "wait_s": round(wait, 3)}
            )
    return sorted(rows, key=lambda r: -r["cpu_s"])


async def paced(loop: Any, args: argparse.Namespace, spy: str) -> dict[str, Any]:
    """Long pairs at ``args.rate`` for ``args.seconds``; the kernel's account of the
    worker's threads over that window, closed once the last pair sent was scored."""
    pool = relabel(long_pairs(int(args.rate * args.seconds) + 10, seed=5), "prof")
    clock0 = thread_clock(loop.worker.pid)
    t0 = time.monotonic()
    sent = 0
    if not args.rate:
        await asyncio.sleep(args.seconds)
    else:
        for i, pair in enumerate(pool):
            if time.monotonic() - t0 >= args.seconds:
                break
            await loop.publish(pair)
            sent += 1
            delay = t0 + (i + 1) / args.rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
        # Count the window's CPU only once what was sent in it is scored.
        await loop.wait_scored([p.pair_id for p in pool[:sent]], timeout=60)
    names = python_thread_names(spy, loop.worker.pid)
    threads = thread_deltas(clock0, thread_clock(loop.worker.pid), names)
    window = time.monotonic() - t0
    cpu = sum(t["cpu_s"] for t in threads)
    return {
        "pairs_sent": sent,
        "window_s": round(window, 2),
        "worker_cpu_s": round(cpu, 3),
        "worker_wait_s": round(sum(t["wait_s"] for t in threads), 3),
        "pairs_per_worker_cpu_s": round(sent / cpu, 1) if sent else None,
        "threads": threads,
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    async with warm_loop(seed=97, dtype=args.dtype) as (_, loop):
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
            account = await paced(loop, args, spy)
            await asyncio.to_thread(recorder.wait, 60)
            if recorder.returncode != 0 or not out.exists():
                err = recorder.stderr.read().decode() if recorder.stderr else ""
                raise RuntimeError(f"py-spy failed ({recorder.returncode}): {err[-500:]}")
            collapsed = out.read_text()
            if args.stacks is not None:
                args.stacks.write_text(collapsed)
            self_top, incl_top = top_frames(collapsed, args.top)
    also = None
    if args.also_dtype and args.also_dtype != args.dtype:
        # The same load on a fresh worker in the other dtype, not sampled: only the
        # kernel's account, so the two CPU figures differ by the dtype alone.
        async with warm_loop(seed=97, dtype=args.also_dtype) as (_, loop):
            assert loop.worker.pid is not None
            also = {"dtype": args.also_dtype, **await paced(loop, args, spy)}
    return {
        "bench": "profile_worker",
        "rate_pairs_per_s": args.rate,
        "dtype": args.dtype,
        "seconds": args.seconds,
        "cpu_bf16": native_bf16(),
        **account,
        "also": also,
        "self": [(f, round(s, 4)) for f, s in self_top],
        "inclusive": [(f, round(s, 4)) for f, s in incl_top],
    }


def also_line(result: dict[str, Any]) -> list[str]:
    """The other dtype's account beside this one's, when it was run."""
    also = result.get("also")
    if not also:
        return []
    ratio = (also["pairs_per_worker_cpu_s"] or 0) / (result["pairs_per_worker_cpu_s"] or 1)
    return [
        f"The same load on a fresh worker with `embedding.dtype: {also['dtype']}` (not "
        f"sampled; CPU bf16 flags: {result['cpu_bf16']}): {also['worker_cpu_s']} CPU-seconds, "
        f"**{also['pairs_per_worker_cpu_s']} pairs per worker CPU-second** "
        f"({ratio:.2f}x).",
        "",
    ]


def markdown(result: dict[str, Any]) -> str:
    def rows(items: list[tuple[str, float]]) -> list[str]:
        return [f"| {100 * share:.1f} % | `{frame}` |" for frame, share in items]

    per_pair = result["pairs_per_worker_cpu_s"]
    dtype = "" if result["dtype"] == "float32" else f" --dtype {result['dtype']}"
    if result.get("also"):
        dtype += f" --also-dtype {result['also']['dtype']}"
    return "\n".join(
        [
            SECTION,
            "",
            f"`python bench/profile_worker.py --rate {result['rate_pairs_per_s']:g} --seconds "
            f"{result['seconds']:g}{dtype}`: py-spy samples one worker (every thread, 100 Hz) "
            "while long pairs arrive at that rate. Shares are of all samples, idle threads "
            "included.",
            "",
            f"The kernel's account of the window ({result['window_s']} s, {result['pairs_sent']} "
            f"pairs, until the last was scored): the worker spent {result['worker_cpu_s']} "
            f"CPU-seconds and waited {result['worker_wait_s']} s on a run queue"
            + (f": **{per_pair} pairs per worker CPU-second**." if per_pair else " (idle)."),
            "",
            *also_line(result),
            "| thread | CPU s | run-queue wait s |",
            "|---|---:|---:|",
            *(f"| {t['name']} | {t['cpu_s']} | {t['wait_s']} |" for t in result["threads"][:8]),
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
    ap.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                    help="MiniLM's embedding.dtype in the worker")  # fmt: skip
    ap.add_argument("--also-dtype", choices=("float32", "bfloat16"), default=None,
                    help="then the same load, unsampled, on a worker in this dtype")  # fmt: skip
    ap.add_argument("--stacks", type=Path, default=None, help="keep the collapsed stacks here")
    args = ap.parse_args(argv)
    result = asyncio.run(run(args))
    return finish(result, markdown(result), args.write, SECTION, args.json)


if __name__ == "__main__":
    raise SystemExit(main())
