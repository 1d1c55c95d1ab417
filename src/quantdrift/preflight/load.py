"""``load``: the route at 1.5x its stated peak, through the gateway, for a set duration.

Open loop: request *i* is sent at ``i / rate`` seconds whatever happened to the
earlier ones, so a slow server builds a queue and shows it in the latencies
(a closed-loop tool, one user waiting on each reply, slows down with the
server and hides exactly the stall this check looks for: coordinated
omission). Locust and similar maintained tools are closed-loop per user and
would add gevent to an asyncio process, so this is a small httpx schedule.
Requests beyond ``max_in_flight`` are counted as errors ("overload"), not queued.

Pass when: error rate <= max, no window of ``burst_window_s`` with an error
burst, no stall (a gap of ``stall_s`` with requests outstanding and none
completing), p99 under the bound (when one is set), and each watched
process (gateway, upstream: local pids) alive at the end with RSS grown by no
more than ``max_rss_growth``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass
from typing import Any

import httpx

from quantdrift.preflight.context import Context
from quantdrift.preflight.report import Item, judged, skipped

LOAD = "load"
TITLE = "Load at 1.5x peak: no OOM, no stall, no error burst"


@dataclass(frozen=True, slots=True)
class Sample:
    start_s: float  # since the run began
    latency_s: float
    ok: bool
    status: str


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100); None for no values.

    >>> percentile([1.0, 2.0, 3.0, 4.0], 50), percentile([], 99)
    (2.0, None)
    """
    if not values:
        return None
    s = sorted(values)
    return s[max(0, -(-int(q * len(s)) // 100) - 1)]


def longest_stall(samples: list[Sample]) -> float:
    """Longest time with requests outstanding and no completion (seconds)."""
    events = sorted((s.start_s + s.latency_s, s.start_s) for s in samples)
    worst, last_done = 0.0, None
    for done, started in events:
        since = started if last_done is None else max(last_done, started)
        worst = max(worst, done - since)
        last_done = done
    return worst


def error_bursts(
    samples: list[Sample], window_s: float, rate: float, min_errors: int = 5
) -> list[float]:
    """Window starts (s) where errors exceed ``rate`` of the window's requests."""
    if not samples:
        return []
    end = max(s.start_s for s in samples)
    out, t = [], 0.0
    while t <= end:
        inside = [s for s in samples if t <= s.start_s < t + window_s]
        errors = sum(not s.ok for s in inside)
        if inside and errors >= min_errors and errors / len(inside) > rate:
            out.append(round(t, 3))
        t += window_s / 2
    return out


def rss_growth(series: list[float]) -> float:
    """Relative growth from the first quarter's median to the last quarter's.

    >>> rss_growth([100, 100, 100, 100, 120, 120, 125, 125])
    0.25
    """
    if len(series) < 4:
        return 0.0
    q = len(series) // 4
    head, tail = sorted(series[:q]), sorted(series[-q:])
    a, b = head[len(head) // 2], tail[len(tail) // 2]
    return b / a - 1 if a > 0 else 0.0


async def run_open_loop(
    url: str,
    body: dict[str, Any],
    rate: float,
    duration_s: float,
    max_in_flight: int,
    timeout_s: float = 60.0,
    headers: dict[str, str] | None = None,
) -> list[Sample]:
    samples: list[Sample] = []
    in_flight = 0
    limits = httpx.Limits(max_connections=max_in_flight, max_keepalive_connections=max_in_flight)
    async with httpx.AsyncClient(
        base_url=url.rstrip("/"), timeout=timeout_s, limits=limits, headers=headers or {}
    ) as c:
        t0 = time.perf_counter()

        async def one(start: float) -> None:
            nonlocal in_flight
            in_flight += 1
            try:
                r = await c.post("/v1/chat/completions", json=body)
                ok, status = r.status_code == 200, str(r.status_code)
            except httpx.HTTPError as exc:
                ok, status = False, type(exc).__name__
            finally:
                in_flight -= 1
            samples.append(Sample(start, time.perf_counter() - t0 - start, ok, status))

        tasks = []
        n = int(rate * duration_s)
        for i in range(n):
            due = i / rate
            delay = due - (time.perf_counter() - t0)
            if delay > 0:
                await asyncio.sleep(delay)
            if in_flight >= max_in_flight:
                samples.append(Sample(due, 0.0, False, "overload"))
                continue
            tasks.append(asyncio.create_task(one(time.perf_counter() - t0)))
        await asyncio.gather(*tasks)
    return sorted(samples, key=lambda s: s.start_s)


async def _watch_rss(pids: dict[str, int], stop: asyncio.Event, every_s: float) -> dict[str, Any]:
    # Deferred: psutil is a dev extra; only the memory watch needs it.
    import psutil

    series: dict[str, list[float]] = {n: [] for n in pids}
    died: set[str] = set()
    procs = {}
    for name, pid in pids.items():
        try:
            procs[name] = psutil.Process(pid)
        except psutil.Error:
            died.add(name)
    while True:
        for name, p in procs.items():
            if name in died:
                continue
            try:
                series[name].append(p.memory_info().rss / 2**20)
            except psutil.Error:
                died.add(name)
        if stop.is_set():
            break
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), every_s)
    return {"series_mb": series, "died": sorted(died)}


async def load(ctx: Context) -> Item:
    c = ctx.config.load
    url = c.url or ctx.config.gateway_url
    if url is None:
        return skipped(LOAD, TITLE, "set load.url or gateway_url (the gateway to load)")
    if c.peak_rps is None:
        return skipped(LOAD, TITLE, "set load.peak_rps (the route's stated peak)")
    rate = c.peak_rps * c.multiplier
    body: dict[str, Any] = {
        "messages": [{"role": "user", "content": c.prompt}],
        "max_tokens": c.max_tokens,
        "temperature": 0,
    }
    # The gateway's own route header: the request's ``model`` stays the upstream's business.
    headers = {"x-quantdrift-route": ctx.config.route} if ctx.config.route else {}
    ctx.progress(f"{LOAD}: {rate:g} req/s open loop for {c.duration_s:g}s against {url}")
    stop = asyncio.Event()
    every_s = max(0.5, c.duration_s / 60)
    watcher = asyncio.create_task(_watch_rss(c.pids, stop, every_s))
    try:
        samples = await run_open_loop(
            url, body, rate, c.duration_s, c.max_in_flight, headers=headers
        )
    finally:
        stop.set()
        rss = await watcher
    lat = [s.latency_s for s in samples if s.ok]
    errors = sum(not s.ok for s in samples)
    err_rate = errors / len(samples) if samples else 1.0
    stall = longest_stall(samples)
    bursts = error_bursts(samples, c.burst_window_s, c.burst_error_rate)
    p99 = percentile(lat, 99)
    growth = {n: round(rss_growth(v), 4) for n, v in rss["series_mb"].items()}
    problems = []
    if err_rate > c.max_error_rate:
        problems.append(f"error rate {err_rate:.2%} > {c.max_error_rate:.2%}")
    if bursts:
        problems.append(f"error bursts at {bursts[:5]} s")
    if stall >= c.stall_s:
        problems.append(f"stall of {stall:.1f}s")
    if c.max_p99_s is not None and (p99 is None or p99 > c.max_p99_s):
        problems.append(f"p99 {p99}s > {c.max_p99_s}s")
    if rss["died"]:
        problems.append(f"process gone (OOM?): {', '.join(rss['died'])}")
    problems += [f"{n} RSS +{g:.0%}" for n, g in growth.items() if g > c.max_rss_growth]
    if not c.pids and c.require_rss:
        problems.append("RSS not watched: set load.pids {gateway: PID, upstream: PID}")
    statuses: dict[str, int] = {}
    for s in samples:
        statuses[s.status] = statuses.get(s.status, 0) + 1
    return judged(
        LOAD,
        TITLE,
        not problems,
        {
            "rate_rps": round(rate, 6),
            "requests": len(samples),
            "error_rate": round(err_rate, 4),
            "p50_s": percentile(lat, 50),
            "p99_s": p99,
            "longest_stall_s": round(stall, 3),
            "rss_growth": growth,
        },
        {
            "multiplier": c.multiplier,
            "max_error_rate": c.max_error_rate,
            "max_p99_s": c.max_p99_s,
            "stall_s": c.stall_s,
            "max_rss_growth": c.max_rss_growth,
            "duration_s": c.duration_s,
        },
        why="; ".join(problems) or f"{len(samples)} requests at {rate:g}/s, p99 {p99:.3f}s",
        statuses=statuses,
        bursts=bursts,
        latency_series=[[round(s.start_s, 3), round(s.latency_s, 4), s.ok] for s in samples[:5000]],
        rss_series_mb={n: [round(x, 1) for x in v] for n, v in rss["series_mb"].items()},
        rss_every_s=every_s,
    )
