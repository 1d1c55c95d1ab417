"""What the gateway adds: latency and time to first token, direct to the upstream vs through it.

A scripted OpenAI-compatible upstream (raw asyncio HTTP/1.1, chunked SSE) waits
``--delay-ms`` before the first token, then sends ``--tokens`` tokens
``--token-ms`` apart, longer than the gateway's stream hold-back (48 tokens by
default). The gateway runs in-process on uvicorn; a client sends N sequential
streamed requests per scenario and measures the time to the first content
token (TTFT) and to the last byte:

* ``direct``: the client talks to the upstream itself (the baseline);
* ``gateway``: through the gateway, shadowing off;
* ``gateway+shadow``: every request mirrored to the reference in the background,
  pairs offered to a publisher whose broker is down (the drop path);
* ``gateway, holdback 0``: the hold-back turned off, which shows what the
  hold-back costs in TTFT (the price of a silent fallback in the first tokens).

The rows report p50/p99 of both, and the p50/p99 added over ``direct``.

    python bench/gateway_overhead.py --requests 200 [--json] [--write BENCHMARKS.md]
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
from gateway_serving import dead_broker_publisher, quiet_logs, serving
from scripted_upstream import upstream

from quantdrift.gateway.gateway_config import parse_config
from quantdrift.gateway.http.service import Gateway
from quantdrift.stack import free_port

SECTION = "## Gateway overhead and time to first token"


def _has_content(data: str) -> bool:
    choices = json.loads(data).get("choices") or []
    return any((c.get("delta") or {}).get("content") for c in choices)


async def measure(url: str, path: str, n: int, warmup: int = 5) -> list[tuple[float, float]]:
    """(ttft, total) seconds of ``n`` sequential streamed requests."""
    body = {"model": "bench", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    out: list[tuple[float, float]] = []
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        for i in range(n + warmup):
            t0 = time.perf_counter()
            ttft = None
            async with client.stream("POST", path, json=body) as r:
                if r.status_code != 200:
                    raise SystemExit(f"request failed: {r.status_code}")
                async for line in r.aiter_lines():
                    if ttft is None and line.startswith("data: {") and _has_content(line[6:]):
                        ttft = time.perf_counter() - t0
            if i >= warmup:
                out.append((ttft or 0.0, time.perf_counter() - t0))
    return out


async def through_gateway(
    up_url: str, n: int, shadow: bool, holdback: int
) -> list[tuple[float, float]]:
    config = parse_config(
        {
            "precisions": {"int4": [up_url], "bf16": [up_url]},
            "routes": {"bench/int4": {"candidate": "int4", "reference": "bf16"}},
            "shadow_sample_rate": 1.0 if shadow else 0.0,
            "stream_holdback_tokens": holdback,
        }
    )
    gateway = Gateway(config, publisher=dead_broker_publisher())
    async with serving(gateway) as url:
        result = await measure(url, "/v1/chat/completions", n)
        await gateway.wait_shadows(30)
    return result


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def main(args: argparse.Namespace) -> dict[str, Any]:
    up_port = free_port()
    up = await upstream(up_port, args.delay_ms / 1000, args.tokens, args.token_ms / 1000)
    up_url = f"http://127.0.0.1:{up_port}"
    runs: dict[str, list[tuple[float, float]]] = {}
    try:
        runs["direct"] = await measure(up_url, "/v1/chat/completions", args.requests)
        runs["gateway"] = await through_gateway(up_url, args.requests, False, 48)
        runs["gateway+shadow"] = await through_gateway(up_url, args.requests, True, 48)
        runs["gateway, holdback 0"] = await through_gateway(up_url, args.requests, False, 0)
    finally:
        up.close()
        await up.wait_closed()
    base_ttft = [t for t, _ in runs["direct"]]
    base_total = [t for _, t in runs["direct"]]
    rows = []
    for name, values in runs.items():
        ttft = [t for t, _ in values]
        total = [t for _, t in values]
        rows.append(
            {
                "path": name,
                "requests": len(values),
                "ttft_p50_ms": round(pct(ttft, 0.5) * 1000, 1),
                "ttft_p99_ms": round(pct(ttft, 0.99) * 1000, 1),
                "total_p50_ms": round(pct(total, 0.5) * 1000, 1),
                "total_p99_ms": round(pct(total, 0.99) * 1000, 1),
                "added_ttft_p50_ms": round((pct(ttft, 0.5) - pct(base_ttft, 0.5)) * 1000, 1),
                "added_total_p50_ms": round((pct(total, 0.5) - pct(base_total, 0.5)) * 1000, 1),
                "added_total_p99_ms": round((pct(total, 0.99) - pct(base_total, 0.99)) * 1000, 1),
            }
        )
    return {
        "upstream": {"delay_ms": args.delay_ms, "tokens": args.tokens, "token_ms": args.token_ms},
        "rows": rows,
    }


def markdown(result: dict[str, Any], requests: int) -> str:
    u = result["upstream"]
    lines = [
        SECTION,
        "",
        f"`python bench/gateway_overhead.py --requests {requests}`: a scripted upstream sends "
        f"its first token after {u['delay_ms']:g} ms, then {u['tokens']} tokens "
        f"{u['token_ms']:g} ms apart (longer than the 48-token hold-back); sequential streamed "
        "requests, client, gateway and upstream in one process. TTFT through the gateway "
        "includes the hold-back (the price of a silent fallback in the first tokens); "
        "`holdback 0` shows the gateway alone.",
        "",
        "| path | TTFT p50 ms | TTFT p99 ms | total p50 ms | total p99 ms "
        "| added TTFT p50 | added total p50 | added total p99 |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in result["rows"]:
        lines.append(
            f"| {r['path']} | {r['ttft_p50_ms']} | {r['ttft_p99_ms']} | {r['total_p50_ms']} "
            f"| {r['total_p99_ms']} | {r['added_ttft_p50_ms']} | {r['added_total_p50_ms']} "
            f"| {r['added_total_p99_ms']} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    from pathlib import Path

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--delay-ms", type=float, default=20.0, help="upstream time to first token")
    parser.add_argument("--tokens", type=int, default=96, help="tokens per answer (> hold-back)")
    parser.add_argument("--token-ms", type=float, default=1.0, help="upstream time per token")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--write", type=Path, default=None)
    args = parser.parse_args()
    if not 1 <= args.requests <= 5000:
        sys.exit("--requests must be in 1..5000")
    quiet_logs()
    result = asyncio.run(main(args))
    text = markdown(result, args.requests)
    if args.write:
        write_section(args.write, text, SECTION)
    if args.json:
        print(json.dumps({"bench": "gateway_overhead", **result}))
    else:
        print(text)
