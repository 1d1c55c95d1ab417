"""A scripted OpenAI-compatible upstream for the integration tests of other stacks' parts.

One uvicorn server in a thread (``start``), or its ``app`` under the gateway's transport
seam in memory (``support.gateway_upstream.in_memory``). ``{url}/{tag}/v1`` is a model
named ``m-{tag}`` that answers every chat completion with a fixed text (settable per
tag while running), or with each of a tag's ``variants`` in turn (a sampled model: two
runs differ), as JSON or as a server-sent-event stream, with usage, an id and, when asked, logprobs,
after a tag's ``delays`` (seconds; an upstream that takes time, or a stalled one).
A tag's ``answer`` (a function of the request body) overrides both when it returns a
text: a model that breaks on some prompts only (a drift confined to one language).
It records every call, so a test can wait on what reached which model.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from quantdrift.stack import free_port

DEFAULT_TEXT = "The capital of France is Paris, a city on the Seine."
PREFERRED = "。"  # what the scripted reference would write where it is forced elsewhere


def words_of(text: str) -> list[str]:
    """The tokens a scripted answer is streamed in (and forced on): its words, spaced."""
    words = [w + " " for w in text.split(" ")]
    words[-1] = words[-1].rstrip()
    return words


def alternatives(tok: str, k: int) -> list[dict[str, Any]]:
    """A scripted model's top-``k`` at a token it would write: itself, then four others."""
    top = [{"token": tok, "logprob": -0.1, "bytes": None}]
    top += [{"token": f"alt{i}", "logprob": -3.0 - i, "bytes": None} for i in range(4)]
    return top[:k]


class ScriptedLLM:
    def __init__(self) -> None:
        self.texts: dict[str, str] = {}
        self.variants: dict[str, list[str]] = {}
        self.delays: dict[str, float] = {}
        self.answer: dict[str, Callable[[dict[str, Any]], str | None]] = {}
        self.forced: dict[str, Callable[[list[str]], list[tuple[float, int]]]] = {}
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.app = app = FastAPI()

        @app.post("/{tag}/v1/score")
        async def score(tag: str, request: Request) -> dict[str, Any]:
            body = await request.json()
            self.calls.append((f"{tag}/score", body))
            tokens = words_of(str(body["continuation"]))
            k = int(body.get("top_k") or 0)
            views = self.forced[tag](tokens) if tag in self.forced else [(-0.1, 1)] * len(tokens)
            reply: dict[str, Any] = {
                "tokens": tokens,
                "continuation_logprobs": [lp for lp, _ in views],
                "usage": {"prompt_tokens": 9, "continuation_tokens": len(tokens)},
            }
            if k:
                reply["continuation_ranks"] = [rank for _, rank in views]
                reply["continuation_top"] = [
                    {
                        a["token"]: a["logprob"]
                        for a in alternatives(PREFERRED if rank > 1 else t, k)
                    }
                    for t, (_, rank) in zip(tokens, views, strict=True)
                ]
            return reply

        @app.post("/{tag}/v1/chat/completions", response_model=None)
        async def chat(tag: str, request: Request) -> Any:
            body = await request.json()
            self.calls.append((tag, body))
            if self.delays.get(tag):
                await asyncio.sleep(self.delays[tag])
            turns = self.variants.get(tag)
            chosen = self.answer[tag](body) if tag in self.answer else None
            if chosen is not None:
                text = chosen
            elif turns:
                text = turns[len(self.calls_to(tag)) % len(turns)]
            else:
                text = self.texts.get(tag, DEFAULT_TEXT)
            words = words_of(text)
            rid = f"up-{tag}-{uuid.uuid4().hex[:8]}"
            head = {"id": rid, "created": int(time.time()), "model": f"m-{tag}"}
            logprobs = bool(body.get("logprobs"))
            k = int(body.get("top_logprobs") or 0)

            def entry(tok: str) -> dict[str, Any]:
                top = alternatives(tok, k)
                return {"token": tok, "logprob": -0.1, "bytes": None, "top_logprobs": top}

            usage = {
                "prompt_tokens": 9,
                "completion_tokens": len(words),
                "total_tokens": 9 + len(words),
            }
            if not body.get("stream"):
                message = {"role": "assistant", "content": text}
                choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": "stop"}
                if logprobs:
                    choice["logprobs"] = {"content": [entry(w) for w in words]}
                return JSONResponse(
                    head | {"object": "chat.completion", "choices": [choice], "usage": usage}
                )

            async def events() -> AsyncIterator[str]:
                chunk = head | {"object": "chat.completion.chunk"}
                for w in words:
                    choice = {"index": 0, "delta": {"content": w}, "finish_reason": None}
                    if logprobs:
                        choice["logprobs"] = {"content": [entry(w)]}
                    yield "data: " + json.dumps(chunk | {"choices": [choice]}) + "\n\n"
                end = {"index": 0, "delta": {}, "finish_reason": "stop"}
                yield "data: " + json.dumps(chunk | {"choices": [end]}) + "\n\n"
                if (body.get("stream_options") or {}).get("include_usage"):
                    yield "data: " + json.dumps(chunk | {"choices": [], "usage": usage}) + "\n\n"
                yield "data: [DONE]\n\n"

            return StreamingResponse(events(), media_type="text/event-stream")

        self.server = uvicorn.Server(
            uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="critical")
        )
        self.server.install_signal_handlers = lambda: None  # type: ignore[method-assign]
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def base(self, tag: str) -> str:
        return f"{self.url}/{tag}/v1"

    def calls_to(self, tag: str) -> list[dict[str, Any]]:
        return [body for t, body in self.calls if t == tag]

    def start(self) -> ScriptedLLM:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            assert time.monotonic() < deadline, "scripted upstream did not start"
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(5)
