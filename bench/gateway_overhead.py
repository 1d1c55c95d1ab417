"""User-visible latency of the gateway with shadowing off and on.

A scripted OpenAI-compatible upstream (raw asyncio HTTP, fixed delay before the
first byte, a short SSE answer with logprobs) serves every precision; the gateway
runs in-process on uvicorn; a client sends N sequential requests per scenario and
measures the time to the full answer. Shadowing on means every request is also
mirrored to the reference in the background and the pair is offered to a
ShadowPublisher (pointed at a dead broker unless --bootstrap is given, so the
numbers include the drop path, the worst case for the request path).

    python bench/gateway_overhead.py --requests 300 --delay-ms 20 [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from typing import Any

import httpx
import uvicorn

from quantdrift.config import KafkaSettings
from quantdrift.gateway.app import Gateway, create_app
from quantdrift.gateway.gateway_config import parse_config
from quantdrift.gateway.publisher import ShadowPublisher
from quantdrift.stack import free_port

TOKENS = ["Hello", " there", ",", " the", " answer", " is", " forty", " two", "."]


def _sse(content: str | None, finish: str | None = None) -> bytes:
    delta = {} if content is None else {"content": content}
    lp = None
    if content:
        top = [{"token": content, "logprob": -0.3}, {"token": "x", "logprob": -1.5}]
        lp = {"content": [{"token": content, "logprob": -0.3, "top_logprobs": top}]}
    body = {
        "id": "b",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "bench",
        "choices": [{"index": 0, "delta": delta, "logprobs": lp, "finish_reason": finish}],
    }
    return b"data: " + json.dumps(body).encode() + b"\n\n"


async def upstream(port: int, delay_s: float) -> asyncio.Server:
    """Minimal HTTP/1.1 keep-alive server answering every POST with the same SSE stream."""
    payload = b"".join(
        [_sse(""), *(_sse(t) for t in TOKENS), _sse(None, "stop"), b"data: [DONE]\n\n"]
    )

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                await reader.readexactly(length)
                await asyncio.sleep(delay_s)
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                    b"content-length: " + str(len(payload)).encode() + b"\r\n\r\n" + payload
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    return await asyncio.start_server(handle, "127.0.0.1", port)


async def scenario(
    shadow: bool, n: int, up_url: str, bootstrap: str | None, stream: bool
) -> list[float]:
    config = parse_config(
        {
            "precisions": {"int4": [up_url], "bf16": [up_url]},
            "routes": {"bench/int4": {"candidate": "int4", "reference": "bf16"}},
            "shadow_sample_rate": 1.0 if shadow else 0.0,
        }
    )
    kafka = KafkaSettings(bootstrap_servers=bootstrap or f"127.0.0.1:{free_port()}")
    publisher = ShadowPublisher(kafka, 1.0, queue_size=1000, topic="quantdrift.bench.pairs")
    gateway = Gateway(config, publisher=publisher)
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(create_app(gateway), host="127.0.0.1", port=port, log_level="critical")
    )
    server.install_signal_handlers = lambda: None  # type: ignore[method-assign]
    task = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    body: dict[str, Any] = {"messages": [{"role": "user", "content": "hi"}], "stream": stream}
    latencies: list[float] = []
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
            for i in range(n + 10):
                t0 = time.perf_counter()
                if stream:
                    async with client.stream("POST", "/v1/chat/completions", json=body) as r:
                        async for _ in r.aiter_bytes():
                            pass
                else:
                    r = await client.post("/v1/chat/completions", json=body)
                if r.status_code != 200:
                    raise SystemExit(f"request failed: {r.status_code}")
                if i >= 10:  # warm-up excluded
                    latencies.append((time.perf_counter() - t0) * 1000.0)
            await gateway.wait_shadows(10)
    finally:
        server.should_exit = True
        await task
    return latencies


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def main(args: argparse.Namespace) -> list[dict[str, Any]]:
    up_port = free_port()
    up = await upstream(up_port, args.delay_ms / 1000.0)
    rows = []
    try:
        for stream in (False, True):
            for shadow in (False, True):
                lat = await scenario(
                    shadow, args.requests, f"http://127.0.0.1:{up_port}", args.bootstrap, stream
                )
                rows.append(
                    {
                        "mode": "stream" if stream else "non-stream",
                        "shadow": "on" if shadow else "off",
                        "requests": len(lat),
                        "p50_ms": round(statistics.median(lat), 2),
                        "p99_ms": round(pct(lat, 0.99), 2),
                        "mean_ms": round(statistics.fmean(lat), 2),
                    }
                )
    finally:
        up.close()
        await up.wait_closed()
    return rows


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--delay-ms", type=float, default=20.0, help="upstream delay per call")
    parser.add_argument("--bootstrap", default=None, help="a real broker (default: a dead one)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if not 1 <= args.requests <= 5000:
        sys.exit("--requests must be in 1..5000")
    import logging

    logging.basicConfig(level=logging.ERROR)  # the dead broker's reconnect warnings
    logging.getLogger("quantdrift").setLevel(logging.ERROR)
    result = asyncio.run(main(args))
    if args.json:
        print(json.dumps({"upstream_delay_ms": args.delay_ms, "rows": result}, indent=2))
    else:
        print(f"upstream delay {args.delay_ms:g} ms, {args.requests} sequential requests each\n")
        print("| mode | shadow | p50 ms | p99 ms | mean ms |")
        print("|---|---|---|---|---|")
        for r in result:
            print(
                f"| {r['mode']} | {r['shadow']} | {r['p50_ms']} | {r['p99_ms']} | {r['mean_ms']} |"
            )
