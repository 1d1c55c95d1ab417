"""``POST /v1/completions``, the legacy text API, kept cheap.

Same auth, routes, preferences, privileges and slice tags as chat (so a slice held
apart from its route holds its text completions too), the same chain and its
upstream-failure fallbacks (before the first chunk only), the same retry budget
and deadline. What it does not do: the JSON and degeneration guards, and
shadowing (pairs are chat-shaped; a text completion has no messages to mirror).
The body passes through an allowlist of the completions parameters.

``plan_completion`` is pure; ``open_chain`` walks the chain with the one walker
(``attempts.Walk``); ``fold`` builds the non-streamed answer from chunks.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from quantdrift.gateway.chain.attempts import Chunks, Walk
from quantdrift.gateway.chain.planning import (
    CLIENT_ID_HEADER,
    Incoming,
    Refusal,
    checked_fields,
    plan_tags,
    route_and_preference,
    route_decision,
    upstream_body,
    usage_asked,
)
from quantdrift.gateway.chain.routing import Decision
from quantdrift.gateway.gateway_config import GatewayConfig

COMPLETION_FIELDS = frozenset(
    {
        "prompt",
        "model",
        "best_of",
        "echo",
        "frequency_penalty",
        "logit_bias",
        "logprobs",
        "max_tokens",
        "n",
        "presence_penalty",
        "seed",
        "stop",
        "stream",
        "stream_options",
        "suffix",
        "temperature",
        "top_p",
        "user",
    }
)
EXTENSIONS = frozenset({"route", "precision_preference"})


@dataclass(frozen=True, slots=True)
class CompletionPlan:
    request_id: str
    client_request_id: str | None
    route: str
    decision: Decision
    body: dict[str, Any]
    stream: bool
    include_usage: bool
    # The request's slice (``slices.request_tags`` of its prompt), as chat computes it:
    # a slice held apart from the route holds its text completions too.
    tags: Mapping[str, str] = field(default_factory=dict)

    @property
    def expects_json(self) -> bool:
        """Never: a text completion has no JSON contract (and no guards)."""
        return False


def plan_completion(
    config: GatewayConfig, body: Mapping[str, Any], incoming: Incoming
) -> CompletionPlan | Refusal:
    """Decide one text completion (pure), with chat's route, allowlist and decoding checks.

    >>> from quantdrift.gateway.guards.auth import OPEN
    >>> from quantdrift.gateway.gateway_config import parse_config
    >>> cfg = parse_config({"precisions": {"a": ["http://a"], "b": ["http://b"]},
    ...                     "routes": {"r": {"candidate": "a", "reference": "b"}}})
    >>> p = plan_completion(cfg, {"prompt": "hi", "max_tokens": 3},
    ...                     Incoming({}, OPEN, "cmpl-1", directive_of=lambda r: None))
    >>> p.decision.chain, p.body
    (('a', 'b'), {'prompt': 'hi', 'max_tokens': 3})
    """
    chosen = route_and_preference(config, body, incoming.headers, incoming.principal)
    if isinstance(chosen, Refusal):
        return chosen
    route, preference = chosen
    if not isinstance(body.get("prompt"), str | list) or not body.get("prompt"):
        return Refusal(400, "prompt must be a non-empty string or list", "prompt")
    checked = checked_fields(config, body, COMPLETION_FIELDS | EXTENSIONS)
    if isinstance(checked, Refusal):
        return checked
    unknown, _n = checked
    tags = plan_tags(body, incoming, expects_json=False)
    return CompletionPlan(
        request_id=incoming.request_id,
        client_request_id=incoming.headers.get(CLIENT_ID_HEADER),
        route=route,
        decision=route_decision(config, route, preference, incoming, tags),
        body=upstream_body(body, {*EXTENSIONS, *unknown}),
        stream=bool(body.get("stream")),
        include_usage=usage_asked(body),
        tags=tags,
    )


def fold(chunks: list[dict[str, Any]], request_id: str) -> dict[str, Any]:
    """A ``text_completion`` body from streamed chunks: text per choice index, usage.

    >>> fold([{"id": "c", "model": "m", "choices": [{"index": 0, "text": "a"}]},
    ...       {"choices": [{"index": 0, "text": "b", "finish_reason": "stop"}]},
    ...       {"choices": [], "usage": {"total_tokens": 3}}], "r")["choices"][0]["text"]
    'ab'
    """
    texts: dict[int, list[str]] = {}
    finish: dict[int, str | None] = {}
    logprobs: dict[int, dict[str, list[Any]]] = {}
    head: dict[str, Any] = {}
    usage = None
    for chunk in chunks:
        for key in ("id", "model", "created", "system_fingerprint"):
            if chunk.get(key) and key not in head:
                head[key] = chunk[key]
        if isinstance(chunk.get("usage"), dict):
            usage = chunk["usage"]
        for c in chunk.get("choices") or ():
            if not isinstance(c, dict):
                continue
            i = c.get("index", 0) if isinstance(c.get("index"), int) else 0
            texts.setdefault(i, []).append(str(c.get("text") or ""))
            if c.get("finish_reason"):
                finish[i] = c["finish_reason"]
            lp = c.get("logprobs")
            if isinstance(lp, dict):  # streamed logprobs come in pieces: lists to extend
                merged = logprobs.setdefault(i, {})
                for key, value in lp.items():
                    if isinstance(value, list):
                        merged.setdefault(key, []).extend(value)
    body: dict[str, Any] = {
        "id": head.get("id") or f"cmpl-{request_id}",
        "object": "text_completion",
        "created": head.get("created", 0),
        "model": head.get("model", ""),
        "choices": [
            {
                "index": i,
                "text": "".join(texts[i]),
                "logprobs": logprobs.get(i),
                "finish_reason": finish.get(i) or "stop",
            }
            for i in sorted(texts)
        ],
    }
    if usage is not None:
        body["usage"] = usage
    return body


PATH = "/v1/completions"


async def open_chain(walk: Walk) -> tuple[str, list[dict[str, Any]], Chunks]:
    """The first precision of the chain whose stream started: (precision, first chunks, rest).

    The walk decides every fallback (budget, deadline, records); a text completion
    falls back on upstream failures before its first chunk only.
    """
    for attempt in walk:
        async with attempt as stream:
            try:
                first = [await anext(stream)]
            except StopAsyncIteration:
                first = []
            return attempt.precision, first, stream
    raise walk.failure


async def drain(first: list[dict[str, Any]], stream: Chunks) -> list[dict[str, Any]]:
    """Every chunk of a started answer (for ``fold``); the stream is closed at the end."""
    async with contextlib.aclosing(stream):
        return first + [chunk async for chunk in stream]
