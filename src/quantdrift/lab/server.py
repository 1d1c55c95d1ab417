"""An OpenAI-compatible server for one lab variant (``quantdrift lab serve``).

Endpoints (loopback only, one model per process):

* ``GET /health`` -> ``{"status": "ok", "model": ..., "precision": ...}``
* ``POST /v1/chat/completions`` -- OpenAI chat completions, non-streaming and
  streaming (SSE ``data: {...}`` chunks, then ``data: [DONE]``). Honoured:
  ``messages``, ``temperature`` (0 = greedy), ``top_p``, ``max_tokens``,
  ``seed``, ``n`` (1-8, decoded as one batch; choice i samples with seed + i),
  ``stream``, ``stream_options.include_usage`` (a last chunk with no choices and
  the ``usage``), ``logprobs``, ``top_logprobs`` (0-20). Non-streamed answers
  carry ``usage``. ``response_format`` is accepted and not enforced; unknown
  fields are ignored. Extension: a top-level ``quantdrift`` object with
  ``precision`` and per-token ``entropy`` (nats).
* ``POST /v1/score`` -- teacher-forced scoring: body ``{"messages": [...] or
  "prompt": "...", "continuation": "text"}`` returns
  ``{"tokens": [...], "continuation_logprobs": [...]}``, this model's log-prob
  of each continuation token after the chat-templated prompt (what vLLM calls
  prompt logprobs). ``/v1/chat/completions`` with a ``continuation`` field
  answers the same way.

Generation runs in a single worker thread (one model, one request at a time),
so the event loop keeps answering ``/health`` and queued requests wait.
"""

from __future__ import annotations

import asyncio
import json
import random
import threading
import time
import uuid
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from quantdrift.lab.generate import Generation, Step, encode_chat, generate, score_continuations
from quantdrift.lab.model import MODEL_NAME

MAX_NEW_TOKENS = 512
DEFAULT_MAX_TOKENS = 128
MAX_N = 8


class Message(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: str
    content: str


class ChatRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    messages: list[Message] = Field(min_length=1)
    model: str | None = None
    temperature: float = Field(default=1.0, ge=0, le=2)
    top_p: float = Field(default=1.0, gt=0, le=1)
    max_tokens: int | None = Field(default=None, ge=1, le=MAX_NEW_TOKENS)
    max_completion_tokens: int | None = Field(default=None, ge=1, le=MAX_NEW_TOKENS)
    seed: int | None = None
    n: int = Field(default=1, ge=1, le=MAX_N)
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    response_format: dict[str, Any] | None = None  # accepted, not enforced
    continuation: str | None = None


class ScoreRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    messages: list[Message] | None = None
    prompt: str | None = None
    continuation: str


def _entry(step: Step) -> dict[str, Any]:
    """One token in OpenAI's logprobs.content shape."""
    return {
        "token": step.token,
        "logprob": step.logprob,
        "bytes": list(step.token.encode("utf-8")),
        "top_logprobs": [
            {"token": t, "logprob": lp, "bytes": list(t.encode("utf-8"))}
            for t, lp in step.top.items()
        ],
    }


def _trim_top(step: Step, k: int) -> Step:
    top = dict(list(step.top.items())[:k])
    return Step(step.token_id, step.token, step.logprob, step.entropy, top)


def create_app(model: Any, tokenizer: Any, precision: str) -> FastAPI:
    """The ASGI app around one loaded model."""
    app = FastAPI(title=f"quantdrift lab: {MODEL_NAME} @ {precision}")
    worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lab-gen")
    model_id = f"{MODEL_NAME}@{precision}"

    @app.exception_handler(RequestValidationError)
    async def _bad_request(_: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {"msg": "invalid request", "loc": ()}
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
        message = f"{where}: {first['msg']}" if where else str(first["msg"])
        return JSONResponse(
            {"error": {"message": message, "type": "invalid_request_error"}}, status_code=400
        )

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok", "model": MODEL_NAME, "precision": precision}

    def _prompt_ids(messages: list[Message] | None, prompt: str | None) -> list[int]:
        if messages:
            return encode_chat(tokenizer, [m.model_dump() for m in messages])
        return encode_chat(tokenizer, prompt or "")

    def _score(body: ScoreRequest) -> dict[str, Any]:
        prompt_ids = _prompt_ids(body.messages, body.prompt)
        cont = list(tokenizer(body.continuation, add_special_tokens=False)["input_ids"])
        pad = tokenizer.pad_token_id or 0
        scores = score_continuations(model, [prompt_ids], [cont], pad=pad)[0] if cont else []
        return {
            "object": "score",
            "model": model_id,
            "precision": precision,
            "tokens": [tokenizer.decode([t]) for t in cont],
            "token_ids": cont,
            "continuation_logprobs": scores,
            "usage": {"prompt_tokens": len(prompt_ids), "continuation_tokens": len(cont)},
        }

    @app.post("/v1/score")
    async def score(body: ScoreRequest) -> dict[str, Any]:
        return await asyncio.get_running_loop().run_in_executor(worker, _score, body)

    @app.post("/v1/chat/completions", response_model=None)
    async def chat(body: ChatRequest) -> JSONResponse | StreamingResponse | dict[str, Any]:
        loop = asyncio.get_running_loop()
        if body.continuation is not None:
            req = ScoreRequest(messages=body.messages, continuation=body.continuation)
            return await loop.run_in_executor(worker, _score, req)
        prompt_ids = encode_chat(tokenizer, [m.model_dump() for m in body.messages])
        max_new = body.max_completion_tokens or body.max_tokens or DEFAULT_MAX_TOKENS
        seed = body.seed if body.seed is not None else random.randrange(2**31)
        top_k = max(1, body.top_logprobs or 0)
        created, cid = int(time.time()), f"chatcmpl-{uuid.uuid4().hex[:24]}"

        n = body.n

        def run(on_step: Any = None, stop: Any = None) -> list[Generation]:
            return generate(
                model, tokenizer, [prompt_ids] * n,
                max_new_tokens=max_new, temperature=body.temperature, top_p=body.top_p,
                seeds=[seed + i for i in range(n)], top_k=top_k, on_step=on_step,
                should_stop=stop,
            )  # fmt: skip

        def usage(gens: list[Generation]) -> dict[str, int]:
            completion = sum(len(g.steps) for g in gens)
            return {
                "prompt_tokens": len(prompt_ids),
                "completion_tokens": completion,
                "total_tokens": len(prompt_ids) + completion,
            }

        def logprobs_of(steps: list[Step]) -> dict[str, Any] | None:
            if not body.logprobs:
                return None
            k = body.top_logprobs or 0
            return {"content": [_entry(_trim_top(s, k)) for s in steps]}

        if not body.stream:
            gens = await loop.run_in_executor(worker, run)
            return {
                "id": cid,
                "object": "chat.completion",
                "created": created,
                "model": model_id,
                "system_fingerprint": precision,
                "choices": [
                    {
                        "index": i,
                        "message": {"role": "assistant", "content": gen.text},
                        "logprobs": logprobs_of(gen.steps),
                        "finish_reason": gen.finish_reason,
                    }
                    for i, gen in enumerate(gens)
                ],
                "usage": usage(gens),
                "quantdrift": {
                    "precision": precision,
                    "entropy": [s.entropy for s in gens[0].steps],
                    "latency_ms": gens[0].latency_ms,
                },
            }

        Item = tuple[int, Step] | list[Generation] | BaseException
        queue: asyncio.Queue[Item] = asyncio.Queue()
        cancelled = threading.Event()
        include_usage = bool((body.stream_options or {}).get("include_usage"))

        def on_step(index: int, step: Step) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, (index, step))

        def produce() -> None:
            try:
                result: Item = run(on_step, cancelled.is_set)
            except Exception as exc:  # reported to the client as an error chunk
                result = exc
            loop.call_soon_threadsafe(queue.put_nowait, result)

        def frame(choices: list[dict[str, Any]], **extra: Any) -> str:
            body_ = {
                "id": cid,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model_id,
                "system_fingerprint": precision,
                "choices": choices,
                **extra,
            }
            return f"data: {json.dumps(body_, ensure_ascii=False)}\n\n"

        def chunk(index: int, delta: dict[str, Any], **extra: Any) -> str:
            choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": None}
            choice.update(extra)
            return frame([choice])

        async def events() -> AsyncIterator[str]:
            future = loop.run_in_executor(worker, produce)
            ids: list[list[int]] = [[] for _ in range(n)]
            sent = [""] * n
            try:
                for i in range(n):
                    yield chunk(i, {"role": "assistant", "content": ""})
                while True:
                    item = await queue.get()
                    if isinstance(item, BaseException):
                        err = {"error": {"message": str(item), "type": "server_error"}}
                        yield f"data: {json.dumps(err)}\n\n"
                        break
                    if isinstance(item, list):
                        for i, gen in enumerate(item):
                            done = sent[i]
                            tail = gen.text[len(done) :] if gen.text.startswith(done) else ""
                            if tail:
                                yield chunk(i, {"content": tail})
                            yield chunk(i, {}, finish_reason=gen.finish_reason)
                        if include_usage:
                            yield frame([], usage=usage(item))
                        break
                    index, step = item
                    ids[index].append(step.token_id)
                    text = tokenizer.decode(ids[index], skip_special_tokens=True)
                    # Hold back a partial UTF-8 character (CJK spans several tokens).
                    delta = "" if text.endswith("\ufffd") else text[len(sent[index]) :]
                    sent[index] += delta
                    yield chunk(index, {"content": delta}, logprobs=logprobs_of([step]))
                yield "data: [DONE]\n\n"
            finally:
                cancelled.set()  # client gone or done: stop decoding early
                if future.done() and not future.cancelled():
                    future.result()

        return StreamingResponse(events(), media_type="text/event-stream")

    return app


def serve(
    precision: str, *, host: str = "127.0.0.1", port: int = 8100, threads: int | None = None
) -> None:
    """Load the reference, quantize it to ``precision`` unless ``ref-f32``, and serve."""
    # Deferred: uvicorn, the model and torch load only when a lab server starts.
    import uvicorn

    from quantdrift.lab import model as lab_model
    from quantdrift.lab.quant import quantize_model, variant

    spec = None if precision == lab_model.REFERENCE_PRECISION else variant(precision)
    model, tokenizer = lab_model.load(threads=threads)
    if spec is not None:
        quantize_model(model, spec)
    uvicorn.run(create_app(model, tokenizer, precision), host=host, port=port, log_level="warning")
