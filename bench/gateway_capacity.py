"""Gateway capacity side by side: direct, `quantdrift gateway` (5 % shadowing), LiteLLM proxy.

One scripted upstream (``scripted_upstream.py``, its own process) serves every
target; every target runs as its own process(es), so the CPU each uses is
read from its process tree (psutil) and is not the load generator's. Per target:

* **added latency** at a fixed load: open-loop non-streamed requests at a rate
  below both proxies' saturation (``--load-share``, 0.5, of the slower one's
  saturation measured first in the same run; or ``--rate``) for ``--seconds``, so
  the figure is each proxy's overhead and not its queue; latency counts from each
  request's scheduled send time (no coordinated omission); ``added_p50_ms`` /
  ``added_p99_ms`` are the target's p50 / p99 minus direct's at the same rate.
  The fixed loads run ``--rounds`` times, every target in turn each round, and
  each figure is the median over rounds of that round's difference, with the
  p99's range beside it: a 20-second window's p99 is its 11th-worst request, and
  with the gateway's code unchanged one window gave 35 ms (inside ``make bench``)
  and another 2 ms (run alone). While a target is measured, the
  CPU the other targets' processes spend idle (``others_cores``) is read too,
  since everything shares the machine;
* **streamed TTFT overhead**: open-loop streamed requests at ``--stream-rate``
  (never above the non-streamed rate);
  ``ttft_overhead_ms`` is the target's TTFT p50 minus direct's. The quantdrift
  gateway holds free-text streams back ``stream_holdback_tokens`` (48) tokens
  before the first byte (the price of a silent fallback), so its TTFT includes
  48 upstream token times.
* **requests/s per core at saturation**: closed loop, ``--concurrency``
  requests in flight for ``--sat-seconds``; ``rps_per_core`` is completed
  requests over the CPU-seconds the target's processes used (for ``direct``,
  the upstream's own). The load generator shares the machine, so on a small
  machine it can be what saturates first: ``cores_used`` says how busy the
  target really was.
* **gateway processes scaling**: the same saturation run against two
  ``quantdrift gateway`` processes (the client alternates between them, as a
  load balancer would), reported in the ``quantdrift`` entry as
  ``scaling_2_vs_1`` (requests/s of two over one).

The quantdrift gateway publishes its 5 % shadow pairs to an embedded broker
(a real send path) and runs ``--no-control`` (no Redis, no signing keys: route
commands are not what this measures). LiteLLM runs from ``.venv-litellm``
(``make bench-litellm``): a server we talk to, never a library we import.

    python bench/gateway_capacity.py [--load-share 0.5 | --rate R] [--seconds 20 ...] [--json]
        [--write BENCHMARKS.md]

With ``--json`` the output ends with one JSON object keyed by target
(``direct``, ``quantdrift``, ``litellm``), each with ``added_p50_ms``,
``added_p99_ms``, ``rps_per_core`` and ``ttft_overhead_ms`` (and ``fixed_rate``,
the rate they were measured at).

Every target runs at once (idle while another is measured): saturation runs
first, one target after the other, then the fixed loads, then the two gateway
processes alone.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from common import machine, tree_cpu_seconds, write_section

from quantdrift.stack import EmbeddedStack, free_port

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PATH = "/v1/chat/completions"
LITELLM_VENV = ROOT / ".venv-litellm"
SECTION = "## Gateway capacity: direct, quantdrift, LiteLLM (bench/gateway_capacity.py)"


def body(stream: bool) -> dict[str, Any]:
    return {"model": "bench", "messages": [{"role": "user", "content": "hi"}], "stream": stream}


@dataclass
class Target:
    """One thing to send requests to: its base URL(s) and the processes that serve them."""

    name: str
    urls: list[str]
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    logs: list[Path] = field(default_factory=list)

    def cpu_seconds(self) -> float:
        return tree_cpu_seconds(proc.pid for proc in self.procs)

    def log_tail(self) -> str:
        return "\n".join(p.read_text(errors="replace")[-2000:] for p in self.logs if p.exists())


def spawn(
    argv: Sequence[str], env: dict[str, str] | None = None
) -> tuple[subprocess.Popen[bytes], Path]:
    log = Path(tempfile.mkstemp(prefix="qd-capacity-", suffix=".log")[1])
    proc = subprocess.Popen(
        list(argv),
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        env={**os.environ, **(env or {})},
        start_new_session=True,
    )
    return proc, log


def stop(procs: Sequence[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


async def wait_ready(target: Target, probe: str, timeout: float) -> None:
    """Poll ``probe`` on every URL until it answers 2xx; fail with the target's log."""
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession() as session:
        for url in target.urls:
            while True:
                for proc in target.procs:
                    if proc.poll() is not None:
                        raise SystemExit(f"{target.name} exited:\n{target.log_tail()}")
                with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError):
                    async with session.get(url + probe, timeout=aiohttp.ClientTimeout(2)) as r:
                        if r.status < 300:
                            break
                if time.monotonic() > deadline:
                    raise SystemExit(f"{target.name} not ready in {timeout}s:\n{target.log_tail()}")
                await asyncio.sleep(0.2)


def gateway_config(upstream_url: str, path: Path) -> Path:
    config = {
        "precisions": {"int4": [upstream_url], "bf16": [upstream_url]},
        "pools": {
            side: {"max_connections": 1024, "acquire_timeout_s": 5} for side in ("int4", "bf16")
        },
        "routes": {"bench/int4": {"candidate": "int4", "reference": "bf16"}},
        "default_route": "bench/int4",
        "shadow_sample_rate": 0.05,
        "noise_sample_rate": 0.0,
        "sample_salt": "capacity-bench",
    }
    path.write_text(json.dumps(config))  # JSON is YAML
    return path


def litellm_config(upstream_url: str, path: Path) -> Path:
    config = {
        "model_list": [
            {
                "model_name": "bench",
                "litellm_params": {
                    "model": "openai/bench",
                    "api_base": upstream_url + "/v1",
                    "api_key": "none",
                },
            }
        ],
        "litellm_settings": {"telemetry": False, "drop_params": True},
    }
    path.write_text(json.dumps(config))
    return path


@contextlib.contextmanager
def quantdrift_gateways(
    upstream_url: str, bootstrap: str, n: int, workdir: Path
) -> Iterator[Target]:
    config = gateway_config(upstream_url, workdir / "gateway.yaml")
    target = Target("quantdrift" if n == 1 else f"quantdrift x{n}", [])
    env = {"QUANTDRIFT_KAFKA__BOOTSTRAP_SERVERS": bootstrap, "QUANTDRIFT_KAFKA__LINGER_MS": "5"}
    try:
        for _ in range(n):
            port = free_port()
            proc, log = spawn(
                [sys.executable, "-m", "quantdrift", "gateway", "--config", str(config),
                 "--port", str(port), "--no-control", "--log-level", "warning"],
                env,
            )  # fmt: skip
            target.urls.append(f"http://127.0.0.1:{port}")
            target.procs.append(proc)
            target.logs.append(log)
        yield target
    finally:
        stop(target.procs)


@contextlib.contextmanager
def litellm_proxy(upstream_url: str, workdir: Path) -> Iterator[Target]:
    exe = LITELLM_VENV / "bin" / "litellm"
    if not exe.exists():
        raise SystemExit(
            f"{exe} missing: run `make bench-litellm` (or pass --targets without litellm)"
        )
    config = litellm_config(upstream_url, workdir / "litellm.yaml")
    port = free_port()
    proc, log = spawn(
        [str(exe), "--config", str(config), "--host", "127.0.0.1", "--port", str(port),
         "--num_workers", "1"],
        {
            "LITELLM_LOG": "ERROR",
            "LITELLM_TELEMETRY": "False",
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # offline: no fetch at startup
            "NO_DOCS": "True",
        },
    )  # fmt: skip
    target = Target("litellm", [f"http://127.0.0.1:{port}"], [proc], [log])
    try:
        yield target
    finally:
        stop(target.procs)


def pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


async def one(session: aiohttp.ClientSession, url: str, stream: bool) -> float | None:
    """Send one request; for a stream, seconds to the first content token (else None)."""
    t0 = time.perf_counter()
    async with session.post(url + PATH, json=body(stream)) as r:
        if r.status != 200:
            raise RuntimeError(f"{url}: HTTP {r.status}: {(await r.text())[:200]}")
        if not stream:
            await r.read()
            return None
        ttft = None
        async for line in r.content:
            if ttft is None and line.startswith(b"data: {"):
                choices = json.loads(line[6:]).get("choices") or []
                if any((c.get("delta") or {}).get("content") for c in choices):
                    ttft = time.perf_counter() - t0
        return ttft


@contextlib.asynccontextmanager
async def client(concurrency: int) -> AsyncIterator[aiohttp.ClientSession]:
    connector = aiohttp.TCPConnector(limit=concurrency, limit_per_host=concurrency)
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        yield session


async def open_loop(target: Target, rate: float, seconds: float, stream: bool) -> dict[str, Any]:
    """Requests at fixed intervals; latency from the scheduled time, TTFT from the send."""
    n = max(1, int(rate * seconds))
    urls = itertools.cycle(target.urls)
    latencies: list[float] = []
    ttfts: list[float] = []
    errors: list[str] = []
    async with client(1024) as session:
        start = time.perf_counter()

        async def fire(i: int, url: str) -> None:
            scheduled = start + i / rate
            try:
                ttft = await one(session, url, stream)
            except (TimeoutError, aiohttp.ClientError, RuntimeError) as exc:
                errors.append(repr(exc)[:200])
                return
            latencies.append(time.perf_counter() - scheduled)
            if ttft is not None:
                ttfts.append(ttft)

        tasks = []
        for i in range(n):
            delay = start + i / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(fire(i, next(urls))))
        await asyncio.gather(*tasks)
    return {
        "requests": n,
        "errors": len(errors),
        "first_error": errors[0] if errors else None,
        "p50_ms": round(pct(latencies, 0.5) * 1000, 2),
        "p99_ms": round(pct(latencies, 0.99) * 1000, 2),
        "ttft_p50_ms": round(pct(ttfts, 0.5) * 1000, 2) if stream else None,
    }


async def saturate(target: Target, concurrency: int, seconds: float) -> dict[str, Any]:
    """Closed loop: ``concurrency`` requests always in flight; rps and the target's CPU."""
    done = 0
    errors = 0
    async with client(concurrency) as session:
        stop_at = time.perf_counter() + seconds
        cpu0, t0 = target.cpu_seconds(), time.perf_counter()

        async def loop(url: str) -> None:
            nonlocal done, errors
            while time.perf_counter() < stop_at:
                try:
                    await one(session, url, stream=False)
                    done += 1
                except (TimeoutError, aiohttp.ClientError, RuntimeError):
                    errors += 1

        urls = itertools.cycle(target.urls)
        await asyncio.gather(*(loop(next(urls)) for _ in range(concurrency)))
        wall, cpu = time.perf_counter() - t0, target.cpu_seconds() - cpu0
    return {
        "rps": round(done / wall, 1),
        "errors": errors,
        "cores_used": round(cpu / wall, 2),
        "rps_per_core": round(done / cpu, 1) if cpu > 0 else None,
    }


async def warm_up(target: Target) -> None:
    """Both paths once (connection pools, lazy imports) before anything counts."""
    await open_loop(target, 20.0, 1.0, stream=False)
    await open_loop(target, 10.0, 1.0, stream=True)


async def fixed_loads(
    target: Target, others: Sequence[Target], rate: float, stream_rate: float, seconds: float
) -> dict[str, Any]:
    """One round of both fixed loads on ``target``, with the cores ``others`` (idle, but
    running) spent meanwhile: what of the machine they took from the measured one."""
    cpu0, t0 = sum(o.cpu_seconds() for o in others), time.perf_counter()
    fixed = await open_loop(target, rate, seconds, stream=False)
    stream = await open_loop(target, stream_rate, seconds, stream=True)
    spent = sum(o.cpu_seconds() for o in others) - cpu0
    return {
        "fixed": fixed,
        "stream": stream,
        "others_cores": round(spent / (time.perf_counter() - t0), 3),
    }


def fixed_rates(
    args: argparse.Namespace, saturation: dict[str, dict[str, Any]]
) -> tuple[float, float]:
    """The fixed loads: ``--rate`` if given, else ``--load-share`` of the slower proxy's
    saturation, so added latency is each proxy's overhead and not its queue. The
    streamed rate is never above the non-streamed one."""
    proxies = [r["rps"] for name, r in saturation.items() if name != "direct" and r["rps"]]
    rate = args.rate or round(args.load_share * min(proxies or [saturation["direct"]["rps"]]), 1)
    return rate, min(args.stream_rate, rate)


def entry(
    rounds: Sequence[dict[str, Any]],
    base: Sequence[dict[str, Any]],
    saturation: dict[str, Any],
    rate: float,
    stream_rate: float,
) -> dict[str, Any]:
    """One target's figures over the rounds: each added figure is the median over rounds
    of the target's percentile minus direct's in the same round."""

    def added(key: str, part: str = "fixed") -> list[float]:
        return [r[part][key] - b[part][key] for r, b in zip(rounds, base, strict=True)]

    errors = saturation["errors"] + sum(
        r["fixed"]["errors"] + r["stream"]["errors"] for r in rounds
    )
    p99s = added("p99_ms")
    first_error = next(
        (r[part]["first_error"] for r in rounds for part in ("fixed", "stream")
         if r[part]["first_error"]),
        None,
    )  # fmt: skip
    return {
        "added_p50_ms": round(statistics.median(added("p50_ms")), 2),
        "added_p99_ms": round(statistics.median(p99s), 2),
        "added_p99_ms_range": [round(min(p99s), 2), round(max(p99s), 2)],
        "rps_per_core": saturation["rps_per_core"],
        "ttft_overhead_ms": round(statistics.median(added("ttft_p50_ms", "stream")), 2),
        "p50_ms": statistics.median(r["fixed"]["p50_ms"] for r in rounds),
        "p99_ms": statistics.median(r["fixed"]["p99_ms"] for r in rounds),
        "ttft_p50_ms": statistics.median(r["stream"]["ttft_p50_ms"] for r in rounds),
        "saturation_rps": saturation["rps"],
        "cores_used": saturation["cores_used"],
        "others_cores_max": max(r["others_cores"] for r in rounds),
        "rounds": len(rounds),
        "fixed_rate": rate,
        "stream_rate": stream_rate,
        "errors": errors,
        "first_error": first_error,
    }


async def side_by_side(
    args: argparse.Namespace, direct: Target, upstream_url: str, bootstrap: str, workdir: Path
) -> dict[str, Any]:
    """Every target up at once (idle while another is measured): saturation first, then
    the fixed loads at a rate below the slower proxy's saturation."""
    with contextlib.ExitStack() as started:
        targets = {"direct": direct}
        if "quantdrift" in args.targets:
            targets["quantdrift"] = started.enter_context(
                quantdrift_gateways(upstream_url, bootstrap, 1, workdir)
            )
            await wait_ready(targets["quantdrift"], "/health", 120)
        if "litellm" in args.targets:
            targets["litellm"] = started.enter_context(litellm_proxy(upstream_url, workdir))
            await wait_ready(targets["litellm"], "/health/liveliness", 300)
        saturation = {}
        for name, target in targets.items():
            await warm_up(target)
            saturation[name] = await saturate(target, args.concurrency, args.sat_seconds)
        rate, stream_rate = fixed_rates(args, saturation)
        runs: dict[str, list[dict[str, Any]]] = {name: [] for name in targets}
        for _ in range(args.rounds):
            for name, target in targets.items():
                others = [t for n, t in targets.items() if n != name]
                runs[name].append(
                    await fixed_loads(target, others, rate, stream_rate, args.seconds)
                )
    return {
        name: entry(r, runs["direct"], saturation[name], rate, stream_rate)
        for name, r in runs.items()
    }


async def two_gateways(
    args: argparse.Namespace, upstream_url: str, bootstrap: str, workdir: Path
) -> dict[str, Any]:
    """The saturation run against two gateway processes, alone on the machine."""
    with quantdrift_gateways(upstream_url, bootstrap, 2, workdir) as two_gw:
        await wait_ready(two_gw, "/health", 120)
        await open_loop(two_gw, 20.0, 1.0, stream=False)
        return await saturate(two_gw, args.concurrency, args.sat_seconds)


async def main(args: argparse.Namespace) -> dict[str, Any]:
    workdir = Path(tempfile.mkdtemp(prefix="qd-capacity-"))
    up_port = free_port()
    up_proc, up_log = spawn(
        [sys.executable, str(HERE / "scripted_upstream.py"), "--port", str(up_port),
         "--delay-ms", str(args.delay_ms), "--tokens", str(args.tokens),
         "--token-ms", str(args.token_ms)]
    )  # fmt: skip
    upstream_url = f"http://127.0.0.1:{up_port}"
    direct = Target("direct", [upstream_url], [up_proc], [up_log])
    out: dict[str, Any] = {}
    try:
        deadline = time.monotonic() + 30
        while not _listening(up_port):
            if up_proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"upstream did not start:\n{direct.log_tail()}")
            await asyncio.sleep(0.05)
        with contextlib.ExitStack() as broker:
            bootstrap = ""
            if "quantdrift" in args.targets:
                bootstrap = broker.enter_context(EmbeddedStack(redis_probe_url=None)).bootstrap
            out = await side_by_side(args, direct, upstream_url, bootstrap, workdir)
            if "quantdrift" in args.targets:
                two = await two_gateways(args, upstream_url, bootstrap, workdir)
                one_rps = out["quantdrift"]["saturation_rps"]
                out["quantdrift"]["two_processes"] = two
                out["quantdrift"]["scaling_2_vs_1"] = (
                    round(two["rps"] / one_rps, 2) if one_rps else None
                )
    finally:
        stop([up_proc])
    return out


def _listening(port: int) -> bool:
    import socket

    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def markdown(result: dict[str, Any], args: argparse.Namespace) -> str:
    m = machine()
    rate, stream_rate = result["direct"]["fixed_rate"], result["direct"]["stream_rate"]
    how = (
        "as asked"
        if args.rate
        else f"{args.load_share:g} of the slower proxy's saturation, measured first"
    )
    lines = [
        SECTION,
        "",
        f"Machine: {m['nproc']} cores, {m['cpu']}; load generator, upstream and targets share "
        "them. "
        f"Scripted upstream: first token after {args.delay_ms:g} ms, {args.tokens} tokens "
        f"{args.token_ms:g} ms apart. Fixed load {rate:g} req/s (non-streamed) and "
        f"{stream_rate:g} req/s (streamed) for {args.seconds:g} s ({how}), {args.rounds} "
        "rounds with every target in turn: each added figure is the median over rounds, the "
        "p99's range beside it; *others idle* is the most CPU the other targets' processes "
        "spent, idle, while this one was measured. Saturation: "
        f"{args.concurrency} in flight for {args.sat_seconds:g} s.",
        "",
        "| target | added p50 ms | added p99 ms | p99 range ms | TTFT overhead ms "
        "| sat. req/s | cores used | req/s per core | others idle, cores | failed requests |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, r in result.items():
        low, high = r["added_p99_ms_range"]
        lines.append(
            f"| {name} | {r['added_p50_ms']} | {r['added_p99_ms']} | {low} to {high} "
            f"| {r['ttft_overhead_ms']} | {r['saturation_rps']} | {r['cores_used']} "
            f"| {r['rps_per_core']} | {r['others_cores_max']} | {r['errors']} |"
        )
    # A target that failed requests is reported with its first error, not hidden: its
    # latency figures count only the requests that succeeded.
    lines += [
        f"\n**{name}: {r['errors']} failed requests**, the first: `{r['first_error']}`."
        for name, r in result.items()
        if r["errors"]
    ]
    qd = result.get("quantdrift")
    if qd:
        two = qd["two_processes"]
        lines += [
            "",
            f"Two quantdrift gateway processes: {two['rps']} req/s at saturation "
            f"({qd['scaling_2_vs_1']}x one process; {two['cores_used']} cores used, "
            f"{two['rps_per_core']} req/s per core against one process's "
            f"{qd['rps_per_core']}). On {m['nproc']} cores shared with the load generator "
            "and the upstream, the two processes cannot get a core each: the speed-up is "
            "bounded by the cores they got, not by the gateway.",
        ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--rate",
        type=float,
        default=None,
        help="fixed load, non-streamed req/s (default: --load-share of the slower proxy's "
        "saturation, measured first in the same run)",
    )
    parser.add_argument(
        "--load-share",
        type=float,
        default=0.5,
        help="the fixed load as a share of the slower proxy's saturation (0 < x < 1)",
    )
    parser.add_argument("--stream-rate", type=float, default=20.0, help="streamed req/s")
    parser.add_argument("--seconds", type=float, default=20.0, help="each fixed-load phase")
    parser.add_argument(
        "--rounds", type=int, default=3, help="fixed-load rounds (every target in turn each)"
    )
    parser.add_argument("--concurrency", type=int, default=64, help="in flight at saturation")
    parser.add_argument("--sat-seconds", type=float, default=15.0)
    parser.add_argument("--delay-ms", type=float, default=20.0, help="upstream time to first token")
    parser.add_argument("--tokens", type=int, default=96, help="tokens per answer (> hold-back)")
    parser.add_argument("--token-ms", type=float, default=1.0)
    parser.add_argument(
        "--targets", nargs="+", default=["quantdrift", "litellm"], choices=["quantdrift", "litellm"]
    )
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--write", type=Path, default=None, help="write/update its section here")
    args = parser.parse_args()
    if (args.rate is not None and args.rate <= 0) or args.stream_rate <= 0 or args.seconds <= 0:
        sys.exit("--rate, --stream-rate and --seconds must be > 0")
    if args.concurrency < 1 or args.rounds < 1 or not 0 < args.load_share < 1:
        sys.exit("--concurrency and --rounds must be >= 1 and --load-share in (0, 1)")
    result = asyncio.run(main(args))
    print(markdown(result, args))
    if args.write:
        write_section(args.write, markdown(result, args), SECTION)
        print(f"wrote {args.write}")
    if args.json:
        print(json.dumps(result))
    failed = [f"{n}: {r['errors']} failed" for n, r in result.items() if r["errors"]]
    if failed:
        sys.exit("failed requests: " + "; ".join(failed))
