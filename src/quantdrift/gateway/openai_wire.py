"""OpenAI's chat-completions wire format: what comes in, what goes out, nothing else.

The one module that knows the JSON shapes: the request fields the gateway
accepts, the error object, SSE framing, folding streamed chunks into choices
(every choice by ``index``: content, ``refusal``, ``tool_calls`` deltas,
logprobs, ``finish_reason``), and the ``chat.completion`` body built back from
them. No I/O: the executor feeds chunks in and sends bytes out.

Examples
--------
>>> acc = Accumulator("int4")
>>> _ = acc.add({"id": "c1", "model": "m", "choices": [
...     {"index": 1, "delta": {"content": "b"}}, {"index": 0, "delta": {"content": "a"}}]})
>>> _ = acc.add({"choices": [{"index": 0, "delta": {"tool_calls": [
...     {"index": 0, "id": "t", "type": "function",
...      "function": {"name": "f", "arguments": "{\\"x\\""}}]}}]})
>>> _ = acc.add({"choices": [{"index": 0, "delta": {"tool_calls": [
...     {"index": 0, "function": {"arguments": ": 1}"}}]}, "finish_reason": "tool_calls"}]})
>>> c = acc.finish()
>>> [ch.text for ch in c.choices], c.choices[0].tool_calls[0]["function"]["arguments"]
(['a', 'b'], '{"x": 1}')
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from quantdrift.schemas.pair import ModelOutput, ToolCall

# OpenAI's chat-completions parameters: these go upstream as the client sent them.
OPENAI_FIELDS = frozenset(
    {
        "messages", "model", "audio", "frequency_penalty", "function_call", "functions",
        "logit_bias", "logprobs", "max_completion_tokens", "max_tokens", "metadata",
        "modalities", "n", "parallel_tool_calls", "prediction", "presence_penalty",
        "prompt_cache_key", "reasoning_effort", "response_format", "safety_identifier",
        "seed", "service_tier", "stop", "store", "stream", "stream_options", "temperature",
        "tool_choice", "tools", "top_logprobs", "top_p", "user", "verbosity",
        "web_search_options",
    }
)  # fmt: skip
# quantdrift's own request fields: read by the gateway, never sent upstream.
EXTENSION_FIELDS = frozenset({"precision_preference", "expected_keys", "route"})
# The gateway sets these per upstream call itself.
GATEWAY_OWNED = frozenset({"stream", "stream_options", "logprobs", "top_logprobs"})

_URL = re.compile(r"\b(?:https?|wss?)://[^\s'\"<>)]+", re.I)
_IPV4 = re.compile(r"\b(?:\d{1,3}\.){3}\d{1,3}(?::\d{1,5})?\b")


# -- errors ------------------------------------------------------------------------


def error_body(
    message: str, type_: str, code: str | None = None, param: str | None = None
) -> dict[str, Any]:
    """OpenAI's error object: ``{"error": {"message", "type", "param", "code"}}``."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def scrub(message: str, hosts: Iterable[str] = ()) -> str:
    """An upstream's message with URLs, IP addresses and the pools' host names taken out.

    >>> scrub("connect to http://10.0.0.3:8000/v1 failed on gpu-7:8000", ["gpu-7:8000"])
    'connect to <upstream> failed on <upstream>'
    >>> scrub("peer 10.1.2.3 reset")
    'peer <upstream> reset'
    """
    out = _IPV4.sub("<upstream>", _URL.sub("<upstream>", message))
    for host in sorted(set(hosts), key=len, reverse=True):
        if host:
            out = out.replace(host, "<upstream>")
    return out[:1000]


# -- SSE -----------------------------------------------------------------------------


def sse(obj: Any) -> bytes:
    """One ``data:`` event."""
    return b"data: " + json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"


DONE = b"data: [DONE]\n\n"
# The event a stream ends on when its upstream failed after forwarding began (chat and text).
STOPPED_MID_STREAM = sse(
    error_body("The model stopped answering mid-stream", "upstream_error", "upstream_disconnected")
)


# -- folding a stream into choices ---------------------------------------------------


@dataclass(slots=True)
class Choice:
    """One choice of a completion, folded from its deltas."""

    index: int
    parts: list[str] = field(default_factory=list)
    refusal_parts: list[str] = field(default_factory=list)
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    finish_reason: str | None = None
    logprobs_content: list[dict[str, Any]] = field(default_factory=list)
    role: str = "assistant"
    entries_seen: int = 0  # per-token entries streamed, kept or not
    # The answer's token ids, where the server reports them (vLLM's ``return_token_ids``):
    # teacher forcing then scores these very tokens (``teacher_forcing.score_vllm_ids``).
    token_ids: list[int] = field(default_factory=list)

    @property
    def text(self) -> str:
        return "".join(self.parts)

    @property
    def refusal(self) -> str | None:
        return "".join(self.refusal_parts) if self.refusal_parts else None

    def add_tool_calls(self, deltas: Any) -> None:
        """Tool-call deltas: matched on their own ``index``; arguments are concatenated."""
        for d in deltas if isinstance(deltas, list) else ():
            if not isinstance(d, dict):
                continue
            i = d.get("index", len(self.tool_calls))
            i = i if isinstance(i, int) and i >= 0 else len(self.tool_calls)
            while len(self.tool_calls) <= i:
                self.tool_calls.append(
                    {"id": "", "type": "function", "function": {"name": "", "arguments": ""}}
                )
            call = self.tool_calls[i]
            if d.get("id"):
                call["id"] = d["id"]
            if d.get("type"):
                call["type"] = d["type"]
            fn = d.get("function")
            if isinstance(fn, dict):
                if fn.get("name"):
                    call["function"]["name"] += str(fn["name"])
                if isinstance(fn.get("arguments"), str):
                    call["function"]["arguments"] += fn["arguments"]


@dataclass(slots=True)
class Delta:
    """What one chunk brought to one choice: its text and per-token top log-probs."""

    index: int
    text: str
    tops: list[dict[str, float]]


@dataclass(slots=True)
class Completion:
    """One model answer, collected from a stream: every choice, usage, timing."""

    precision: str
    model: str = ""
    id: str = ""
    created: int = 0
    choices: list[Choice] = field(default_factory=list)
    usage: dict[str, Any] | None = None
    system_fingerprint: str | None = None
    latency_ms: float = 0.0
    first_token_s: float | None = None  # seconds from the call to its first content
    prompt_token_ids: list[int] | None = None  # vLLM's ``return_token_ids``, else None

    def choice(self, index: int = 0) -> Choice:
        for c in self.choices:
            if c.index == index:
                return c
        return Choice(index)

    @property
    def text(self) -> str:
        return self.choice(0).text

    @property
    def finish_reason(self) -> str | None:
        return self.choice(0).finish_reason

    @property
    def completion_tokens(self) -> int:
        """From ``usage`` when the upstream sent it, else the streamed token entries."""
        if self.usage and isinstance(self.usage.get("completion_tokens"), int):
            return int(self.usage["completion_tokens"])
        return sum(max(c.entries_seen, len(c.logprobs_content)) for c in self.choices)

    def output(self, top_k: int) -> ModelOutput:
        """Choice 0 as one side of a PairEvent: text, and per-token data cut to ``top_k``."""
        entries = self.choice(0).logprobs_content
        tokens = [str(e.get("token", "")) for e in entries]
        chosen = [e.get("logprob") for e in entries]
        aligned = bool(tokens) and all(isinstance(v, int | float) for v in chosen)
        tops = [_top_dict(e, top_k) for e in entries] if aligned and top_k > 0 else None
        return ModelOutput(
            text=self.text,
            model=self.model,
            precision=self.precision,
            tokens=tokens if aligned else None,
            token_logprobs=[float(v) for v in chosen] if aligned else None,  # type: ignore[arg-type]
            top_logprobs=tops if tops and any(tops) else None,
            latency_ms=round(self.latency_ms, 3),
            finish_reason=self.finish_reason,
            tool_calls=_tool_calls(self.choice(0).tool_calls),
        )

    def stripped(self, top_k: int) -> Completion:
        """A copy holding only what a shadow pair needs (choice 0, top-``top_k`` log-probs).

        The queue of shadow jobs holds these, not full payloads: a 4,000-token
        answer with 20 alternatives per token is megabytes; the pair needs its text
        and the top few.
        """
        c = self.choice(0)
        slim = [
            {
                "token": e.get("token", ""),
                "logprob": e.get("logprob"),
                "top_logprobs": (e.get("top_logprobs") or [])[:top_k],
            }
            for e in c.logprobs_content
        ]
        choice = Choice(
            0,
            [c.text],
            tool_calls=c.tool_calls,
            finish_reason=c.finish_reason,
            logprobs_content=slim,
            token_ids=c.token_ids,
        )
        return Completion(
            self.precision,
            self.model,
            self.id,
            self.created,
            [choice],
            self.usage,
            system_fingerprint=self.system_fingerprint,
            latency_ms=self.latency_ms,
            prompt_token_ids=self.prompt_token_ids,
        )


def _ids(value: Any) -> bool:
    """Whether ``value`` is a non-empty list of token ids."""
    return isinstance(value, list) and bool(value) and all(type(v) is int for v in value)


def _tool_calls(calls: list[dict[str, Any]]) -> list[ToolCall] | None:
    """A choice's function calls as a pair side records them (name, arguments), or None.

    >>> _tool_calls([{"id": "c1", "type": "function",
    ...               "function": {"name": "ship", "arguments": '{"n": 2}'}}])
    [ToolCall(name='ship', arguments='{"n": 2}')]
    """
    out = []
    for call in calls:
        fn = call.get("function")
        if isinstance(fn, dict):
            out.append(
                ToolCall(name=str(fn.get("name") or ""), arguments=str(fn.get("arguments") or ""))
            )
    return out or None


def _top_dict(entry: Mapping[str, Any], k: int) -> dict[str, float]:
    top: dict[str, float] = {}
    for alt in (entry.get("top_logprobs") or ())[:k]:
        if isinstance(alt, dict) and isinstance(alt.get("logprob"), int | float):
            tok, lp = str(alt.get("token", "")), float(alt["logprob"])
            top[tok] = max(lp, top.get(tok, lp))
    return top


class Accumulator:
    """Folds streamed chunks into a Completion; ``add`` returns what each choice got."""

    def __init__(
        self,
        precision: str,
        clock: Any = time.perf_counter,
        *,
        keep_logprobs: int | None = None,
        all_choices: bool = True,
    ) -> None:
        """``keep_logprobs``: per-token entries kept per choice (None: all); ``all_choices``
        False keeps them for choice 0 only (what the probes and the pair read): the
        memory an answer holds is bounded by the limits, not by what ``n`` asked for."""
        self.completion = Completion(precision)
        self._keep = keep_logprobs
        self._all_choices = all_choices
        self._clock = clock
        self._t0 = clock()
        self.content_chunks = 0
        self._by_index: dict[int, Choice] = {}

    def _choice(self, index: int) -> Choice:
        c = self._by_index.get(index)
        if c is None:
            c = self._by_index[index] = Choice(index)
        return c

    def add(self, chunk: Mapping[str, Any]) -> list[Delta]:
        c = self.completion
        c.id = c.id or str(chunk.get("id") or "")
        c.model = c.model or str(chunk.get("model") or "")
        c.created = c.created or int(chunk.get("created") or 0)
        if chunk.get("system_fingerprint"):
            c.system_fingerprint = str(chunk["system_fingerprint"])
        if isinstance(chunk.get("usage"), dict):
            c.usage = chunk["usage"]
        if c.prompt_token_ids is None and _ids(chunk.get("prompt_token_ids")):
            c.prompt_token_ids = list(chunk["prompt_token_ids"])
        out: list[Delta] = []
        for raw in chunk.get("choices") or ():
            if not isinstance(raw, dict):
                continue
            index = raw.get("index", 0)
            choice = self._choice(index if isinstance(index, int) else 0)
            delta = raw.get("delta") or raw.get("message") or {}
            if not isinstance(delta, dict):
                delta = {}
            text = delta.get("content")
            text = text if isinstance(text, str) else ""
            if text:
                choice.parts.append(text)
                self.content_chunks += 1
                if c.first_token_s is None:
                    c.first_token_s = self._clock() - self._t0
            if isinstance(delta.get("refusal"), str):
                choice.refusal_parts.append(delta["refusal"])
            if delta.get("tool_calls"):
                choice.add_tool_calls(delta["tool_calls"])
                if c.first_token_s is None:
                    c.first_token_s = self._clock() - self._t0
            if raw.get("finish_reason"):
                choice.finish_reason = str(raw["finish_reason"])
            tops: list[dict[str, float]] = []
            logprobs = raw.get("logprobs")
            entries = logprobs.get("content") if isinstance(logprobs, dict) else None
            keep = self._all_choices or choice.index == 0
            if keep and _ids(raw.get("token_ids")):
                choice.token_ids.extend(raw["token_ids"])
            for entry in entries or ():
                if isinstance(entry, dict):
                    choice.entries_seen += 1
                    if keep and (self._keep is None or choice.entries_seen <= self._keep):
                        choice.logprobs_content.append(entry)
                    tops.append(_top_dict(entry, 20))
            out.append(Delta(choice.index, text, tops))
        return out

    def finish(self) -> Completion:
        self.completion.choices = [self._by_index[i] for i in sorted(self._by_index)]
        self.completion.latency_ms = (self._clock() - self._t0) * 1000.0
        return self.completion

    def text(self, index: int = 0) -> str:
        c = self._by_index.get(index)
        return c.text if c else ""


def as_chunk(body: Mapping[str, Any]) -> dict[str, Any]:
    """A non-streamed ``chat.completion`` as one stream chunk (upstreams that ignore stream)."""
    choices = []
    for choice in body.get("choices") or ():
        if isinstance(choice, dict):
            message = choice.get("message") or {}
            delta = {k: v for k, v in message.items() if k in ("role", "content", "refusal")}
            calls = message.get("tool_calls")
            if isinstance(calls, list):
                delta["tool_calls"] = [
                    {**c, "index": i} for i, c in enumerate(calls) if isinstance(c, dict)
                ]
            choices.append(
                {
                    "index": choice.get("index", 0),
                    "delta": delta,
                    "logprobs": choice.get("logprobs"),
                    "finish_reason": choice.get("finish_reason"),
                }
            )
    return {**body, "object": "chat.completion.chunk", "choices": choices}


# -- what goes back ---------------------------------------------------------------------


def trim_logprobs(logprobs: Any, wanted: bool, top_k: int) -> Any:
    """The client's view of a choice's ``logprobs``: None unless asked, top list cut to k."""
    if not wanted or not isinstance(logprobs, dict):
        return None
    content = logprobs.get("content")
    if not isinstance(content, list):
        return logprobs
    return {
        **logprobs,
        "content": [
            {**e, "top_logprobs": (e.get("top_logprobs") or [])[:top_k]}
            if isinstance(e, dict)
            else e
            for e in content
        ],
    }


# What an upstream adds for the gateway's own use (vLLM's ``return_token_ids``, asked for
# teacher forcing): never passed on to the client, who did not ask for it.
_GATEWAY_ONLY = frozenset({"usage", "quantdrift", "prompt_token_ids", "prompt_text"})


def client_chunk(chunk: Mapping[str, Any], logprobs: bool, top_k: int) -> dict[str, Any]:
    """An upstream chunk as the client gets it: log-probs trimmed, usage and token ids
    removed."""
    out = {k: v for k, v in chunk.items() if k not in _GATEWAY_ONLY}
    choices = chunk.get("choices")
    if isinstance(choices, list):
        out["choices"] = [
            {
                **{k: v for k, v in c.items() if k != "token_ids"},
                "logprobs": trim_logprobs(c.get("logprobs"), logprobs, top_k),
            }
            if isinstance(c, dict)
            else c
            for c in choices
        ]
    return out


def message_of(choice: Choice, text: str) -> dict[str, Any]:
    """A choice as ``message``: content is null only for a pure tool call or refusal."""
    silent = not text and (choice.tool_calls or choice.refusal)
    message: dict[str, Any] = {"role": "assistant", "content": None if silent else text}
    if choice.tool_calls:
        message["tool_calls"] = choice.tool_calls
    message["refusal"] = choice.refusal
    return message


def completion_body(
    completion: Completion,
    texts: Mapping[int, str],
    *,
    request_id: str,
    logprobs: bool,
    top_k: int,
    usage: bool = True,
) -> dict[str, Any]:
    """The ``chat.completion`` answer: every choice, usage when the upstream counted it."""
    choices = []
    for c in completion.choices or [Choice(0)]:
        text = texts.get(c.index, c.text)
        lp = None
        if logprobs and text == c.text:
            lp = trim_logprobs({"content": c.logprobs_content}, True, top_k)
        choices.append(
            {
                "index": c.index,
                "message": message_of(c, text),
                "logprobs": lp,
                "finish_reason": c.finish_reason or "stop",
            }
        )
    body: dict[str, Any] = {
        "id": completion.id or f"chatcmpl-{request_id}",
        "object": "chat.completion",
        "created": completion.created or int(time.time()),
        "model": completion.model,
        "choices": choices,
    }
    if completion.system_fingerprint:
        body["system_fingerprint"] = completion.system_fingerprint
    if usage and completion.usage:
        body["usage"] = completion.usage
    return body


def replay_chunks(
    completion: Completion, texts: Mapping[int, str], *, request_id: str, include_usage: bool
) -> list[bytes]:
    """A buffered answer as one clean stream: per choice role, content, finish; usage; DONE."""
    base = {
        "id": completion.id or f"chatcmpl-{request_id}",
        "object": "chat.completion.chunk",
        "created": completion.created or int(time.time()),
        "model": completion.model,
    }

    def chunk(index: int, delta: dict[str, Any], finish: str | None = None) -> bytes:
        choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish}
        return sse({**base, "choices": [choice]})

    out: list[bytes] = []
    for c in completion.choices or [Choice(0)]:
        text = texts.get(c.index, c.text)
        out.append(chunk(c.index, {"role": "assistant", "content": ""}))
        if text:
            out.append(chunk(c.index, {"content": text}))
        if c.tool_calls:
            calls = [{**call, "index": i} for i, call in enumerate(c.tool_calls)]
            out.append(chunk(c.index, {"tool_calls": calls}))
        if c.refusal:
            out.append(chunk(c.index, {"refusal": c.refusal}))
        out.append(chunk(c.index, {}, c.finish_reason or "stop"))
    if include_usage:
        out.append(usage_chunk(base, completion.usage))
    out.append(DONE)
    return out


def usage_chunk(base: Mapping[str, Any], usage: Mapping[str, Any] | None) -> bytes:
    """The final chunk ``stream_options.include_usage`` asks for: no choices, the usage."""
    keep = ("id", "object", "created", "model", "system_fingerprint")
    head = {k: v for k, v in base.items() if k in keep}
    return sse({**head, "choices": [], "usage": dict(usage) if usage else None})
