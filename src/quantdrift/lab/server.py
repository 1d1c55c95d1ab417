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
  prompt logprobs). With ``top_k`` (1-20) also ``continuation_ranks`` (each token's
  1-based rank under this model) and ``continuation_top`` (this model's top-k at
  each position, ``{token: logprob}``), as vLLM's ``prompt_logprobs: K`` would say.
  ``/v1/chat/completions`` with a ``continuation`` field answers the same way.

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

from quantdrift.lab.generate import (
    ForcedView,
    Generation,
    Step,
    encode_chat,
    forced_views,
    generate,
)
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
    top_k: int = Field(default=0, ge=0, le=20)


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


class LabModel:
    """One loaded model and the single thread that runs it: scoring and the answers."""

    def __init__(self, model: Any, tokenizer: Any, precision: str) -> None:
        self.model, self.tokenizer, self.precision = model, tokenizer, precision
        self.worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lab-gen")
        self.model_id = f"{MODEL_NAME}@{precision}"

    def prompt_ids(self, messages: list[Message] | None, prompt: str | None = None) -> list[int]:
        if messages:
            return encode_chat(self.tokenizer, [m.model_dump() for m in messages])
        return encode_chat(self.tokenizer, prompt or "")

    def score(self, body: ScoreRequest) -> dict[str, Any]:
        """Teacher forcing: this model's log-prob of each continuation token."""
        prompt_ids = self.prompt_ids(body.messages, body.prompt)
        cont = list(self.tokenizer(body.continuation, add_special_tokens=False)["input_ids"])
        pad = self.tokenizer.pad_token_id or 0
        view = ForcedView([], [], [])
        if cont:
            view = forced_views(self.model, [prompt_ids], [cont], pad=pad, top_k=body.top_k)[0]
        reply: dict[str, Any] = {
            "object": "score",
            "model": self.model_id,
            "precision": self.precision,
            "tokens": [self.tokenizer.decode([t]) for t in cont],
            "token_ids": cont,
            "continuation_logprobs": view.logprobs,
            "usage": {"prompt_tokens": len(prompt_ids), "continuation_tokens": len(cont)},
        }
        if body.top_k:
            reply["continuation_ranks"] = view.ranks
            reply["continuation_top"] = [
                {self.tokenizer.decode([t]): lp for t, lp in position} for position in view.top
            ]
        return reply

    async def in_worker(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self.worker, fn, *args)


class ChatAnswer:
    """One chat request's answer: its decoding, its usage, its OpenAI shapes."""

    def __init__(self, lab: LabModel, body: ChatRequest) -> None:
        self.lab, self.body = lab, body
        self.prompt_ids = lab.prompt_ids(body.messages)
        self.max_new = body.max_completion_tokens or body.max_tokens or DEFAULT_MAX_TOKENS
        self.seed = body.seed if body.seed is not None else random.randrange(2**31)
        self.top_k = max(1, body.top_logprobs or 0)
        self.created, self.id = int(time.time()), f"chatcmpl-{uuid.uuid4().hex[:24]}"
        self.n = body.n

    def run(self, on_step: Any = None, stop: Any = None) -> list[Generation]:
        b = self.body
        return generate(
            self.lab.model, self.lab.tokenizer, [self.prompt_ids] * self.n,
            max_new_tokens=self.max_new, temperature=b.temperature, top_p=b.top_p,
            seeds=[self.seed + i for i in range(self.n)], top_k=self.top_k, on_step=on_step,
            should_stop=stop,
        )  # fmt: skip

    def usage(self, gens: list[Generation]) -> dict[str, int]:
        completion = sum(len(g.steps) for g in gens)
        prompt = len(self.prompt_ids)
        return {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        }

    def logprobs_of(self, steps: list[Step]) -> dict[str, Any] | None:
        if not self.body.logprobs:
            return None
        k = self.body.top_logprobs or 0
        return {"content": [_entry(_trim_top(s, k)) for s in steps]}

    def completion(self, gens: list[Generation]) -> dict[str, Any]:
        """The non-streamed ``chat.completion``."""
        return {
            "id": self.id,
            "object": "chat.completion",
            "created": self.created,
            "model": self.lab.model_id,
            "system_fingerprint": self.lab.precision,
            "choices": [
                {
                    "index": i,
                    "message": {"role": "assistant", "content": gen.text},
                    "logprobs": self.logprobs_of(gen.steps),
                    "finish_reason": gen.finish_reason,
                }
                for i, gen in enumerate(gens)
            ],
            "usage": self.usage(gens),
            "quantdrift": {
                "precision": self.lab.precision,
                "entropy": [s.entropy for s in gens[0].steps],
                "latency_ms": gens[0].latency_ms,
            },
        }

    def frame(self, choices: list[dict[str, Any]], **extra: Any) -> str:
        body = {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.lab.model_id,
            "system_fingerprint": self.lab.precision,
            "choices": choices,
            **extra,
        }
        return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"

    def chunk(self, index: int, delta: dict[str, Any], **extra: Any) -> str:
        choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": None}
        choice.update(extra)
        return self.frame([choice])


Item = tuple[int, Step] | list[Generation] | BaseException


class ChatStream:
    """A streamed answer: decoding in the model's thread, chunks on the event loop.

    The thread posts each token (and at the end the generations, or the error) to a
    queue the loop reads; a client that goes away sets ``cancelled``, which stops the
    decoding early.
    """

    def __init__(self, answer: ChatAnswer) -> None:
        self.answer = answer
        self.loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue[Item] = asyncio.Queue()
        self.cancelled = threading.Event()
        self.include_usage = bool((answer.body.stream_options or {}).get("include_usage"))

    def _on_step(self, index: int, step: Step) -> None:
        self.loop.call_soon_threadsafe(self.queue.put_nowait, (index, step))

    def _produce(self) -> None:
        try:
            result: Item = self.answer.run(self._on_step, self.cancelled.is_set)
        except Exception as exc:  # reported to the client as an error chunk
            result = exc
        self.loop.call_soon_threadsafe(self.queue.put_nowait, result)

    def _finish(self, gens: list[Generation], sent: list[str]) -> list[str]:
        a, out = self.answer, []
        for i, gen in enumerate(gens):
            done = sent[i]
            tail = gen.text[len(done) :] if gen.text.startswith(done) else ""
            if tail:
                out.append(a.chunk(i, {"content": tail}))
            out.append(a.chunk(i, {}, finish_reason=gen.finish_reason))
        if self.include_usage:
            out.append(a.frame([], usage=a.usage(gens)))
        return out

    async def events(self) -> AsyncIterator[str]:
        a = self.answer
        future = self.loop.run_in_executor(a.lab.worker, self._produce)
        ids: list[list[int]] = [[] for _ in range(a.n)]
        sent = [""] * a.n
        try:
            for i in range(a.n):
                yield a.chunk(i, {"role": "assistant", "content": ""})
            while True:
                item = await self.queue.get()
                if isinstance(item, BaseException):
                    err = {"error": {"message": str(item), "type": "server_error"}}
                    yield f"data: {json.dumps(err)}\n\n"
                    break
                if isinstance(item, list):
                    for line in self._finish(item, sent):
                        yield line
                    break
                index, step = item
                ids[index].append(step.token_id)
                text = a.lab.tokenizer.decode(ids[index], skip_special_tokens=True)
                # Hold back a partial UTF-8 character (CJK spans several tokens).
                delta = "" if text.endswith("\ufffd") else text[len(sent[index]) :]
                sent[index] += delta
                yield a.chunk(index, {"content": delta}, logprobs=a.logprobs_of([step]))
            yield "data: [DONE]\n\n"
        finally:
            self.cancelled.set()  # client gone or done: stop decoding early
            if future.done() and not future.cancelled():
                future.result()


def create_app(model: Any, tokenizer: Any, precision: str) -> FastAPI:
    """The ASGI app around one loaded model: thin routes over ``LabModel``."""
    app = FastAPI(title=f"quantdrift lab: {MODEL_NAME} @ {precision}")
    lab = LabModel(model, tokenizer, precision)

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

    @app.post("/v1/score")
    async def score(body: ScoreRequest) -> dict[str, Any]:
        result: dict[str, Any] = await lab.in_worker(lab.score, body)
        return result

    @app.post("/v1/chat/completions", response_model=None)
    async def chat(body: ChatRequest) -> JSONResponse | StreamingResponse | dict[str, Any]:
        if body.continuation is not None:
            req = ScoreRequest(messages=body.messages, continuation=body.continuation)
            scored: dict[str, Any] = await lab.in_worker(lab.score, req)
            return scored
        answer = ChatAnswer(lab, body)
        if not body.stream:
            return answer.completion(await lab.in_worker(answer.run))
        return StreamingResponse(ChatStream(answer).events(), media_type="text/event-stream")

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
