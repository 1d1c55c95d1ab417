"""One request's I/O at the edge: its JSON body, its client going away, its headers.

Nothing the caller sends reaches planning unread or unbounded (``json_object``),
nothing it typed reaches a response header unless it is a plain token
(``header_list``), and a client that disconnects cancels the upstream work it
asked for (``until_gone``).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import Awaitable, Iterable
from typing import Any, TypeVar

import orjson
from fastapi import Request
from fastapi.responses import Response

from quantdrift.gateway.chain.attempts import Trace
from quantdrift.gateway.chain.planning import Plan
from quantdrift.gateway.http.openai_errors import error_response, too_large

T = TypeVar("T")


class ClientGone(Exception):
    """The client disconnected before its answer was ready."""


async def until_gone(request: Request, work: Awaitable[T]) -> T:
    """Run ``work``; cancel it (and its upstream call) if the client disconnects."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        done, _ = await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        raise
    finally:
        if not gone.done():
            gone.cancel()
    if task in done:
        return task.result()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task
    raise ClientGone


async def _disconnected(request: Request) -> None:
    """Return once the client has gone (the body is already read: nothing else arrives)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


def declared_too_large(request: Request, max_bytes: int) -> bool:
    """Whether the request's ``Content-Length`` already says its body is past ``max_bytes``."""
    declared = request.headers.get("content-length", "")
    return declared.isdigit() and int(declared) > max_bytes


async def json_object(request: Request, max_bytes: int) -> dict[str, Any] | Response:
    """The request body as a JSON object, or the 4xx that says why it is not one.

    The body is read up to ``max_bytes`` (413 past it, before the rest is held in
    memory) and parsed with orjson, which is strict where ``json`` is lenient: it
    refuses NaN and Infinity, lone surrogates and nesting deeper than 1024, so none
    of them reaches planning, an upstream or a pair.
    """
    if declared_too_large(request, max_bytes):
        return too_large(max_bytes)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:
            return too_large(max_bytes)
        chunks.append(chunk)
    request.state.body_bytes = size
    try:
        body = orjson.loads(b"".join(chunks))
    except orjson.JSONDecodeError as exc:
        return error_response(
            400, f"The body is not valid JSON ({exc})", "invalid_request_error", "invalid_json"
        )
    if not isinstance(body, dict):
        return error_response(
            400, "The body must be a JSON object", "invalid_request_error", "invalid_json"
        )
    return body


_HEADER_TOKEN = re.compile(r"^[A-Za-z0-9_.:@/-]{1,64}$")
_PRINTABLE = re.compile(r"^[\x20-\x7e]+$")


def response_headers(plan: Plan, trace: Trace, precision: str | None = None) -> dict[str, str]:
    """What a served answer says about itself: ids, route, precision, fallbacks, drops."""
    headers = {"x-request-id": plan.request_id, "x-quantdrift-route": plan.route}
    if plan.client_request_id and _PRINTABLE.match(plan.client_request_id[:200]):
        headers["x-client-request-id"] = plan.client_request_id[:200]
    if precision:
        headers["x-quantdrift-precision"] = precision
    if trace.fallbacks:
        headers["x-quantdrift-fallbacks"] = ",".join(trace.fallbacks)
    if trace.truncated:
        headers["x-quantdrift-truncated"] = "max_tokens"
    if plan.dropped_fields:
        headers["x-quantdrift-dropped-fields"] = header_list(plan.dropped_fields)
    return headers


def header_list(names: Iterable[str], limit: int = 500) -> str:
    """Names safe for a response header, comma-joined; any other name is counted, not echoed.

    Nothing the caller typed reaches a header unless it is a plain token: a key
    holding CR/LF (header injection) or a non-latin-1 character (which the server
    cannot encode) shows up as ``+N-unprintable``.

    >>> header_list(["top_k", "bad\\r\\nx: 1", "ключ"])
    'top_k,+2-unprintable'
    """
    names = list(names)
    safe = [n for n in names if _HEADER_TOKEN.match(n)]
    other = len(names) - len(safe)
    return ",".join(safe + ([f"+{other}-unprintable"] if other else []))[:limit]
