"""Users' latency under load with shadowing at 100 % to a slow reference, against shadowing off.

Eight closed-loop users send chat requests (not streamed) through the gateway for a
fixed time per scenario. The candidate upstream answers in a few ms; the
reference upstream takes ``--reference-token-ms`` per token, so with shadowing
on, the shadow side is saturated the whole run: its connections are busy, its
queue is full and drops the oldest job. Scenarios alternate off, on, on, off
(ABBA) so whatever drifts over the run (background load, the slot after a
gateway shut down) hits both modes alike.

Reported: requests answered, p50/p99 per mode, the p99 ratio on/off, and the
shadow jobs dropped. Pairs go to a publisher whose broker is down (the drop
path), as in ``gateway_overhead.py``: the broker's speed is not part of the
figure. The functional guarantee (no user request waits on the shadow side) is
a test, ``tests/integration/test_gateway_load.py``, proven
without a clock; this is the speed figure that goes with it.

    python bench/shadow_isolation.py [--seconds 4] [--rounds 2] [--json] [--write BENCHMARKS.md]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from typing import Any

import httpx
from common import write_section
from gateway_overhead import upstream
from gateway_serving import dead_broker_publisher, serving

from quantdrift.gateway.gateway_config import parse_config
from quantdrift.gateway.http.service import Gateway
from quantdrift.stack import free_port

SECTION = "## Shadowing under load: users' latency, shadow on against off"
USERS = 8


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def drive(client: httpx.AsyncClient, seconds: float) -> list[float]:
    """USERS closed-loop users for ``seconds``: each request's latency (all must be 200)."""
    latencies: list[float] = []
    stop = time.monotonic() + seconds
    body = {"model": "bench", "messages": [{"role": "user", "content": "hi"}]}

    async def user() -> None:
        while time.monotonic() < stop:
            t0 = time.perf_counter()
            resp = await client.post("/v1/chat/completions", json=body)
            latencies.append(time.perf_counter() - t0)
            if resp.status_code != 200:
                raise SystemExit(f"request failed: {resp.status_code} {resp.text[:200]}")

    await asyncio.gather(*(user() for _ in range(USERS)))
    return latencies


async def scenario(
    cand_url: str, ref_url: str, shadow: bool, seconds: float
) -> tuple[list[float], int]:
    config = parse_config(
        {
            "precisions": {"int4": [cand_url], "bf16": [ref_url]},
            "routes": {"bench/int4": {"candidate": "int4", "reference": "bf16"}},
            "shadow_sample_rate": 1.0 if shadow else 0.0,
            "shadow_queue": 64,
            "shadow_concurrency": 4,
            "shadow_max_connections": 4,
            "timeouts": {"connect_s": 5, "read_s": 60, "total_s": 60, "shadow_total_s": 10},
        }
    )
    gateway = Gateway(config, publisher=dead_broker_publisher())
    async with serving(gateway) as url:
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            await drive(client, 0.5)  # warm-up
            latencies = await drive(client, seconds)
        dropped = gateway.shadow.dropped.get("queue_full", 0)
    return latencies, dropped


async def main(args: argparse.Namespace) -> dict[str, Any]:
    cand_port, ref_port = free_port(), free_port()
    cand = await upstream(cand_port, 0.002, 8, 0.0)
    ref = await upstream(ref_port, 0.0, 8, args.reference_token_ms / 1000)
    off: list[float] = []
    on: list[float] = []
    dropped = 0
    try:
        for r in range(args.rounds):
            for shadow in (False, True) if r % 2 == 0 else (True, False):
                got, d = await scenario(
                    f"http://127.0.0.1:{cand_port}",
                    f"http://127.0.0.1:{ref_port}",
                    shadow,
                    args.seconds,
                )
                (on if shadow else off).extend(got)
                dropped += d
    finally:
        for server in (cand, ref):
            server.close()
            await server.wait_closed()
    return {
        "users": USERS,
        "seconds_per_scenario": args.seconds,
        "rounds": args.rounds,
        "reference_token_ms": args.reference_token_ms,
        "off": {
            "requests": len(off),
            "p50_ms": round(pct(off, 0.5) * 1000, 1),
            "p99_ms": round(pct(off, 0.99) * 1000, 1),
        },
        "on": {
            "requests": len(on),
            "p50_ms": round(pct(on, 0.5) * 1000, 1),
            "p99_ms": round(pct(on, 0.99) * 1000, 1),
        },
        "p99_ratio_on_off": round(pct(on, 0.99) / pct(off, 0.99), 2),
        "shadow_dropped_queue_full": dropped,
    }


def markdown(result: dict[str, Any]) -> str:
    off, on = result["off"], result["on"]
    command = (
        f"python bench/shadow_isolation.py --seconds {result['seconds_per_scenario']:g} "
        f"--rounds {result['rounds']}"
    )
    lines = [
        SECTION,
        "",
        f"`{command}`: {result['users']} closed-loop users through the gateway, scenarios "
        "off/on/on/off; with shadowing on every request is mirrored to a reference taking "
        f"{result['reference_token_ms']:g} ms per token, so the shadow side is saturated "
        "(4 connections, queue of 64, oldest dropped). Client, gateway and upstreams share "
        "one process on this machine's cores.",
        "",
        "| shadowing | requests | p50 ms | p99 ms |",
        "|---|---:|---:|---:|",
        f"| off | {off['requests']} | {off['p50_ms']} | {off['p99_ms']} |",
        f"| on (100 %, slow reference) | {on['requests']} | {on['p50_ms']} | {on['p99_ms']} |",
        "",
        f"p99 on/off: **{result['p99_ratio_on_off']}**; shadow jobs dropped (oldest first): "
        f"{result['shadow_dropped_queue_full']}.",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    from pathlib import Path

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=4.0, help="per scenario")
    parser.add_argument("--rounds", type=int, default=2, help="each round is two scenarios")
    parser.add_argument("--reference-token-ms", type=float, default=500.0)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--write", type=Path, default=None)
    args = parser.parse_args()
    if not 0.5 <= args.seconds <= 600:
        sys.exit("--seconds must be in 0.5..600")
    if not 1 <= args.rounds <= 50:
        sys.exit("--rounds must be in 1..50")
    if args.reference_token_ms < 0:
        sys.exit("--reference-token-ms must be >= 0")
    import logging

    logging.basicConfig(level=logging.ERROR)
    logging.getLogger("quantdrift").setLevel(logging.ERROR)
    result = asyncio.run(main(args))
    text = markdown(result)
    if args.write:
        write_section(args.write, text, SECTION)
    if args.json:
        print(json.dumps({"bench": "shadow_isolation", **result}))
    else:
        print(text)
