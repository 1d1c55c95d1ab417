"""The gateway tests' scripted upstream and request helpers.

One small app, a behaviour per path (``{base}/{mode}/{tag}``: good answers, failures,
slow or looping streams, broken JSON), every call recorded. It runs two ways:

* in memory (``scripted_memory``): under the pool client's transport seam
  (``gateway/upstream/transport.py``), through httpx's own ``MockTransport`` and
  ``ASGITransport``: for tests of the gateway's own logic (fallbacks, guards, pairs,
  commands), with no server and no port; ``in_process`` serves the gateway's app the
  same way;
* on the wire (``scripted``, a uvicorn server in a thread): for tests about the wire
  (read timeouts, stalls, disconnects, clients that leave).

``make_config`` builds a gateway config over it, ``serving`` runs a gateway app on a
free port, ``chat_body`` / ``stream_text`` / ``content`` speak the wire. The fixtures
(one upstream per module) are registered by :mod:`support.plugin`.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from quantdrift.gateway.gateway_config import GatewayConfig, parse_config
from quantdrift.gateway.http.app import create_app
from quantdrift.gateway.http.service import Gateway
from quantdrift.gateway.shadow.publisher import ShadowPublisher
from quantdrift.gateway.upstream.httpx_transport import HttpxTransport
from quantdrift.stack import free_port
from support.kafka import consume_n

ROUTE = "chat/int4"
KEY = b"gateway-test-key-of-at-least-32-bytes"
EVIL = "a" * 40 + "!"  # ^(a+)+$ on this backtracks ~2^40 steps in Python's re

# -- the scripted upstream ---------------------------------------------------------------


def _entry(token: str, certain: bool = False) -> dict[str, Any]:
    lp, alts = (0.0, [-30.0, -31.0, -32.0, -33.0]) if certain else (-0.7, [-1.2, -1.9, -2.5, -3.0])
    top = [{"token": token, "logprob": lp}] + [
        {"token": f"{token}~{i}", "logprob": a} for i, a in enumerate(alts)
    ]
    return {"token": token, "logprob": lp, "top_logprobs": top}


def _chunk(
    tag: str,
    content: str | None,
    entry: dict | None = None,
    finish: str | None = None,
    index: int = 0,
    delta: dict[str, Any] | None = None,
) -> str:
    delta = dict(delta or ({} if content is None else {"content": content}))
    choice = {
        "index": index,
        "delta": delta,
        "finish_reason": finish,
        "logprobs": {"content": [entry]} if entry else None,
    }
    return "data: " + json.dumps(_head(tag) | {"choices": [choice]}) + "\n\n"


def _head(tag: str) -> dict[str, Any]:
    return {"id": f"up-{tag}", "object": "chat.completion.chunk", "created": 1, "model": f"m-{tag}"}


def _wants_json(body: dict[str, Any]) -> bool:
    text = json.dumps(body.get("messages", []))
    return bool(body.get("response_format")) or "json" in text.lower()


def _pieces(mode: str, tag: str, body: dict[str, Any]) -> list[tuple[str, bool]]:
    """(token, certain) pieces of the scripted answer."""
    if mode == "loop":
        return [(t, False) for t in ("I ", "am ", "sorry. ") * 40]
    if mode == "collapse":
        return [(f"w{i} ", True) for i in range(120)]
    if mode == "lateloop":
        return [(f"w{i} ", False) for i in range(12)] + [(t, False) for t in ("na ", "na ") * 40]
    if mode == "length":  # a JSON answer cut by max_tokens
        text = '{"answer": "a long answer that ran out of tok'
    elif mode == "badjson":
        text = '{"answer": "ok",, "more": "' + "x" * 40 + '"}'
    elif mode == "missing":
        text = '{"other": 1}'
    elif mode == "ws":
        text = '{"answer":' + " " * 100 + '"ok"}'
    elif mode == "dup":
        text = '{"answer": 1, "answer": 2}'
    elif mode == "evil":  # asked for JSON: a value that ^(a+)+$ backtracks on for hours
        text = json.dumps({"a": EVIL}) if body.get("response_format") else f"hi from {tag}"
    elif _wants_json(body):
        text = '```json\n{"answer": "ok", "precision": "' + tag + '"}\n```'
    else:
        text = f"Hello from {tag}, the answer is forty two."
    return [(text[i : i + 4], False) for i in range(0, len(text), 4)]


class Scripted:
    """A scripted model server; base URL ``{url}/{mode}/{tag}`` picks a behaviour.

    ``wire=True``: served by uvicorn in a thread (``running`` starts it), ``transport``
    None (the gateway's own network transport). Otherwise in memory: ``transport`` is
    the one a ``Gateway`` is given, and ``url`` names no socket.
    """

    def __init__(self, wire: bool = True) -> None:
        self.calls: list[tuple[str, str, dict[str, Any]]] = []
        # mode "gate": answers wait for this (set by default; a test clears it to hold them)
        self.gate = threading.Event()
        self.gate.set()
        self.port = free_port() if wire else 80
        self.url = f"http://127.0.0.1:{self.port}" if wire else "http://scripted.upstream"
        self.app = app = FastAPI()

        @app.post("/{mode}/{tag}/v1/score")
        async def score(mode: str, tag: str, request: Request) -> dict[str, Any]:
            body = await request.json()
            self.calls.append((mode, f"{tag}/score", body))
            words = len(body["continuation"].split())
            # As ``lab serve`` reports it: the chat's tokens and the forced answer's.
            usage = {"prompt_tokens": 5, "continuation_tokens": words}
            return {"continuation_logprobs": [-0.25] * words, "usage": usage}

        @app.post("/{mode}/{tag}/v1/completions", response_model=None)
        async def text(mode: str, tag: str, request: Request) -> Any:
            body = await request.json()
            self.calls.append((mode, f"{tag}/text", body))
            if mode == "e500":
                return JSONResponse({"error": {"message": "boom"}}, status_code=500)
            words = [f"{tag} ", "says ", "hi"]
            usage = bool((body.get("stream_options") or {}).get("include_usage"))

            async def events() -> AsyncIterator[str]:
                head = {"id": f"up-{tag}", "object": "text_completion", "model": f"m-{tag}"}
                for i, w in enumerate(words):
                    finish = "stop" if i == len(words) - 1 else None
                    choice = {"index": 0, "text": w, "logprobs": None, "finish_reason": finish}
                    yield "data: " + json.dumps(head | {"choices": [choice]}) + "\n\n"
                if usage:
                    counts = {"prompt_tokens": 2, "completion_tokens": 3, "total_tokens": 5}
                    yield "data: " + json.dumps(head | {"choices": [], "usage": counts}) + "\n\n"
                yield "data: [DONE]\n\n"

            return StreamingResponse(events(), media_type="text/event-stream")

        @app.post("/{mode}/{tag}/v1/chat/completions", response_model=None)
        async def chat(mode: str, tag: str, request: Request) -> Any:
            body = await request.json()
            self.calls.append((mode, tag, body))
            if mode == "e500":
                return JSONResponse({"error": {"message": "boom"}}, status_code=500)
            if mode == "e503":
                return JSONResponse({"error": {"message": "busy"}}, status_code=503)
            if mode == "e400":
                return JSONResponse({"error": {"message": "bad", "type": "x"}}, status_code=400)
            if mode == "e400url":
                message = f"model not found at {self.url}/v1 (host {self.url.split('//')[1]})"
                return JSONResponse({"error": {"message": message}}, status_code=400)
            if mode == "nolp" and "logprobs" in body:  # a server that refuses logprobs
                return JSONResponse({"error": {"message": "no logprobs here"}}, status_code=400)
            if mode == "never":  # a server that takes the request and never answers
                await asyncio.sleep(600)
            if mode == "slow":
                await asyncio.sleep(3.0)
            pieces = _pieces(mode, tag, body)
            n = int(body.get("n") or 1)
            logprobs = bool(body.get("logprobs"))
            k = int(body.get("top_logprobs") or 0)
            usage = bool((body.get("stream_options") or {}).get("include_usage"))

            def entry(tok: str, certain: bool) -> dict[str, Any] | None:
                if not logprobs:
                    return None
                e = _entry(tok, certain)
                return {**e, "top_logprobs": e["top_logprobs"][:k]}

            async def events() -> AsyncIterator[str]:
                for index in range(n):
                    yield _chunk(tag, "", index=index)
                if mode == "tools":
                    call = {"index": 0, "id": "call_1", "type": "function"}
                    yield _chunk(
                        tag,
                        None,
                        delta={
                            "tool_calls": [
                                {**call, "function": {"name": "lookup", "arguments": '{"city": '}}
                            ]
                        },
                    )
                    yield _chunk(
                        tag,
                        None,
                        delta={"tool_calls": [{"index": 0, "function": {"arguments": '"Paris"}'}}]},
                    )
                    yield _chunk(tag, None, finish="tool_calls")
                elif mode == "refusal":
                    yield _chunk(tag, None, delta={"refusal": "I can't help with that."})
                    yield _chunk(tag, None, finish="stop")
                else:
                    for i, (tok, certain) in enumerate(pieces):
                        if mode == "stall" and i == 2:
                            await asyncio.sleep(3.0)
                        if mode == "gate" and i == 0:  # holds every answer until released
                            while not self.gate.is_set():
                                await asyncio.sleep(0.005)
                        if mode == "disconnect" and i == 3:
                            raise RuntimeError("scripted disconnect")
                        for index in range(n):
                            first = index and not i and not _wants_json(body)
                            piece = f"[{index}] {tok}" if first else tok
                            yield _chunk(tag, piece, entry(tok, certain), index=index)
                        if mode in ("delay", "hang"):
                            await asyncio.sleep(0.002 if mode == "delay" else 0.5)
                    for index in range(n):
                        yield _chunk(
                            tag, None, finish="length" if mode == "length" else "stop", index=index
                        )
                if usage:
                    tokens = len(pieces) * n
                    counts = {"prompt_tokens": 7, "completion_tokens": tokens}
                    yield (
                        "data: "
                        + json.dumps(
                            _head(tag)
                            | {"choices": [], "usage": counts | {"total_tokens": 7 + tokens}}
                        )
                        + "\n\n"
                    )
                yield "data: [DONE]\n\n"

            return StreamingResponse(events(), media_type="text/event-stream")

        self.transport = None if wire else in_memory({self.url: app})
        self.server = uvicorn.Server(
            uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="critical")
        )
        self.server.install_signal_handlers = lambda: None  # type: ignore[method-assign]
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def base(self, mode: str, tag: str) -> str:
        return f"{self.url}/{mode}/{tag}"

    def calls_to(self, tag: str) -> list[dict[str, Any]]:
        return [b for _, t, b in self.calls if t == tag]


@contextmanager
def running(up: Any) -> Iterator[Any]:
    """A scripted upstream (its uvicorn ``server`` in its ``thread``) up until the block
    ends: started and waited for, then asked to exit and joined."""
    up.thread.start()
    deadline = time.monotonic() + 10
    while not up.server.started:
        assert time.monotonic() < deadline, "scripted upstream did not start"
        time.sleep(0.02)
    try:
        yield up
    finally:
        up.server.should_exit = True
        up.thread.join(5)


def in_memory(apps: dict[str, Any]) -> HttpxTransport:
    """The pool client's transport over ASGI apps by origin (``http://host:port``), in
    this process; any other origin is refused, as a closed port is (``ConnectError``)."""
    served = {origin: httpx.ASGITransport(app) for origin, app in apps.items()}

    async def handler(request: httpx.Request) -> httpx.Response:
        app = served.get(f"{request.url.scheme}://{request.url.netloc.decode()}")
        if app is None:
            raise httpx.ConnectError("connection refused (no upstream there)", request=request)
        return await app.handle_async_request(request)

    return HttpxTransport(httpx.MockTransport(handler))


@pytest.fixture(scope="module")
def scripted() -> Iterator[Scripted]:
    """The scripted upstream on the wire: for tests about the wire."""
    with running(Scripted()) as up:
        yield up


@pytest.fixture(scope="module")
def scripted_memory() -> Scripted:
    """The scripted upstream in memory: give ``Gateway`` its ``transport``."""
    return Scripted(wire=False)


def make_config(
    scripted: Scripted, modes: dict[str, str | list[str]], **extra: Any
) -> GatewayConfig:
    def urls(tag: str, mode: str | list[str]) -> list[str]:
        return [
            m if m.startswith("http") else scripted.base(m, tag)
            for m in ([mode] if isinstance(mode, str) else mode)
        ]

    data: dict[str, Any] = {
        "precisions": {tag: urls(tag, mode) for tag, mode in modes.items()},
        "routes": {
            ROUTE: {
                "candidate": "int4",
                "reference": "bf16",
                "teacher_forced": extra.pop("teacher_forced", False),
                "clear_prompts": extra.pop("clear_prompts", False),
                "extra_candidates": extra.pop("extra_candidates", []),
            }
        },
        "shadow_sample_rate": 0.0,
        "timeouts": {"connect_s": 0.5, "read_s": 0.5, "total_s": 10, "shadow_total_s": 10},
        # The upstream serves from a thread of this test process, which shares two cores
        # with the broker: a pause of the process (its collector, that thread) of 0.5 s
        # made the gateway count itself late and shed a request of a test about something
        # else (503 ``overloaded``, twice in CI). Shedding has its own tests, which pass
        # their own ``overload`` (``test_gateway_overload.py``).
        "overload": {"max_loop_lag_s": 30.0},
        **extra,
    }
    return parse_config(data)


async def shadow_pairs(
    gw: Gateway, publisher: ShadowPublisher, bootstrap: str, topic: str, n: int
) -> list[Any]:
    """The ``n`` pairs the gateway's shadow runner published, or a failure naming why not.

    The shadow side runs after the user's answer and counts its failures instead of
    raising (an upstream read timeout, a refused send). A bare read of the topic would
    only say "got 0 of 1"; this waits for the runner and the publisher first, and fails
    with what they counted.
    """
    settled = await gw.shadow.wait_idle(20)
    seen = (
        f"shadow errors {gw.shadow.errors}, dropped {gw.shadow.dropped}, "
        f"publisher {publisher.stats}"
    )
    assert settled, f"the shadow runner still busy after 20 s; {seen}"
    assert not gw.shadow.errors and not gw.shadow.dropped, seen
    deadline = time.monotonic() + 20
    while publisher.stats.sent + publisher.stats.dropped_total < n:
        assert time.monotonic() < deadline, f"pairs not delivered within 20 s; {seen}"
        await asyncio.sleep(0.02)
    assert publisher.stats.sent >= n, seen
    return await consume_n(bootstrap, topic, n, timeout=15)


GOOD = {"int4": "good", "int8": "good", "bf16": "good"}
# For tests of what a pair carries, not of timeouts: the shadow side's upstream calls
# run while the broker and the test share two cores, and a 0.5 s read gap there would
# drop the pair (counted, so shadow_pairs names it) and fail a test that is not about it.
ROOMY = {"connect_s": 2, "read_s": 5, "total_s": 10, "shadow_total_s": 20}


@asynccontextmanager
async def serving(
    gateway: Gateway, create: Callable[[Gateway], FastAPI] = create_app
) -> AsyncIterator[httpx.AsyncClient]:
    """The gateway's app (or ``create``'s, e.g. the collector's) on a free port."""
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(create(gateway), host="127.0.0.1", port=port, log_level="critical")
    )
    server.install_signal_handlers = lambda: None  # type: ignore[method-assign]
    task = asyncio.create_task(server.serve())
    async with asyncio.timeout(15):
        while not server.started:
            await asyncio.sleep(0.01)
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=20) as client:
            yield client
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 20)


@asynccontextmanager
async def in_process(
    gateway: Gateway, create: Callable[[Gateway], FastAPI] = create_app
) -> AsyncIterator[httpx.AsyncClient]:
    """The gateway's app (or ``create``'s) in this process, its lifespan run around the
    block: no port. ``ASGITransport`` hands over an answer once it is whole, so a test
    of streaming's timing or of a client that leaves uses ``serving``."""
    app = create(gateway)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app)
        async with httpx.AsyncClient(
            transport=transport, base_url="http://gateway.test", timeout=20
        ) as client:
            yield client


def chat_body(text: str = "hi", **extra: Any) -> dict[str, Any]:
    return {"model": "any", "messages": [{"role": "user", "content": text}], **extra}


async def stream_text(client: httpx.AsyncClient, body: dict[str, Any], **kw: Any):
    """(response, content, finish_reasons, events) of a streamed request."""
    parts, finishes, events = [], [], []
    async with client.stream(
        "POST", "/v1/chat/completions", json={**body, "stream": True}, **kw
    ) as resp:
        async for line in resp.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            events.append(event)
            for choice in event.get("choices", []):
                parts.append(choice.get("delta", {}).get("content") or "")
                if choice.get("finish_reason"):
                    finishes.append(choice["finish_reason"])
    return resp, "".join(parts), finishes, events


def content(resp: httpx.Response) -> str:
    return resp.json()["choices"][0]["message"]["content"]
