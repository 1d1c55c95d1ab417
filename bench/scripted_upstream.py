"""A scripted OpenAI-compatible upstream for the gateway benches: raw asyncio HTTP/1.1.

Every POST gets the same answer: after ``delay_s`` the first token, then
``tokens`` tokens ``token_s`` apart, as chunked SSE when the request asks
``"stream": true``, else as one JSON body once the same time has passed. Raw
asyncio rather than a web framework so the upstream's own cost stays small and
fixed, and every target of a bench sees the same server.

Run on its own (so its CPU is not the gateway's): ``python bench/scripted_upstream.py
--port P [--delay-ms 20 --tokens 96 --token-ms 1]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json


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


def _chunked(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def _completion(words: list[str]) -> bytes:
    body = {
        "id": "b",
        "object": "chat.completion",
        "created": 1,
        "model": "bench",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "".join(words)},
                "logprobs": None,
                "finish_reason": "stop",
            }
        ],
        "usage": {
            "prompt_tokens": 1,
            "completion_tokens": len(words),
            "total_tokens": 1 + len(words),
        },
    }
    data = json.dumps(body).encode()
    return (
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
        + f"content-length: {len(data)}\r\n\r\n".encode()
        + data
    )


def _wants_stream(body: bytes) -> bool:
    try:
        return bool(json.loads(body).get("stream"))
    except (ValueError, AttributeError):
        return False


async def upstream(port: int, delay_s: float, tokens: int, token_s: float) -> asyncio.Server:
    """HTTP/1.1 keep-alive server answering every POST with the same scripted answer."""
    words = [f" w{i}" for i in range(tokens)]
    whole = _completion(words)

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                body = await reader.readexactly(length)
                if not _wants_stream(body):
                    await asyncio.sleep(delay_s + tokens * token_s)
                    writer.write(whole)
                    await writer.drain()
                    continue
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                    b"transfer-encoding: chunked\r\n\r\n"
                )
                # Paced against the clock, not by one sleep per token: a sleep wakes late
                # by the loop's own overhead, and 96 of them made the streamed answer 12 %
                # slower than the non-streamed one (133 against 119 ms, one client). The
                # gateway streams from upstream, so that was charged as its own added
                # latency. A real engine makes tokens at one pace, streaming or not.
                start = loop.time()
                await asyncio.sleep(delay_s)
                writer.write(_chunked(_sse("")))
                for i, w in enumerate(words):
                    writer.write(_chunked(_sse(w)))
                    await writer.drain()
                    if token_s:
                        await asyncio.sleep(
                            max(0.0, start + delay_s + (i + 1) * token_s - loop.time())
                        )
                writer.write(_chunked(_sse(None, "stop") + b"data: [DONE]\n\n") + b"0\r\n\r\n")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    return await asyncio.start_server(handle, "127.0.0.1", port, backlog=1024)


async def _serve(args: argparse.Namespace) -> None:
    server = await upstream(args.port, args.delay_ms / 1000, args.tokens, args.token_ms / 1000)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--delay-ms", type=float, default=20.0)
    parser.add_argument("--tokens", type=int, default=96)
    parser.add_argument("--token-ms", type=float, default=1.0)
    asyncio.run(_serve(parser.parse_args()))
