"""``CloseUnread``: an answer sent before the body was read whole closes the connection.

The lingering close itself (the server side) is tested against a real gateway
process in ``tests/faults/test_fault_oversized_body.py``.
"""

from __future__ import annotations

from typing import Any

import pytest

from quantdrift.gateway.http.lingering import CloseUnread

LENGTH = [(b"content-length", b"10")]


async def run(headers: list[tuple[bytes, bytes]], reads: int) -> list[dict[str, Any]]:
    """Call an app that reads ``reads`` body messages, then answers 413; return what it sent."""
    incoming = [
        {"type": "http.request", "body": b"12345", "more_body": True},
        {"type": "http.request", "body": b"67890", "more_body": False},
    ]
    sent: list[dict[str, Any]] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        for _ in range(reads):
            await receive()
        await send({"type": "http.response.start", "status": 413, "headers": [(b"a", b"b")]})
        await send({"type": "http.response.body", "body": b"{}"})

    async def receive() -> dict[str, Any]:
        return incoming.pop(0)

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/", "headers": headers}
    await CloseUnread(app)(scope, receive, send)
    return sent


@pytest.mark.parametrize(
    ("headers", "reads", "closes"),
    [
        (LENGTH, 0, True),  # answered on the headers
        (LENGTH, 1, True),  # half the body read
        (LENGTH, 2, False),  # read whole: the connection may be kept
        ([(b"transfer-encoding", b"chunked")], 1, True),
        ([(b"content-length", b"0")], 0, False),  # no body to leave unread
        ([], 0, False),
    ],
)
async def test_an_answer_before_the_body_is_read_says_connection_close(
    headers: list[tuple[bytes, bytes]], reads: int, closes: bool
) -> None:
    start = (await run(headers, reads))[0]
    assert start["status"] == 413 and (b"a", b"b") in start["headers"]
    assert ((b"connection", b"close") in start["headers"]) is closes
