"""Lingering close: a client still sending its body when the answer goes out reads the answer.

The gateway answers some requests before it has read their body: a 413 on the
declared ``Content-Length``, a 401, a 503 shed at the door. A socket closed while
bytes it has not read are still arriving answers them with a TCP reset; the
client, still writing, gets ``ECONNRESET`` on its next send and never reads the
answer it was sent, and an SDK that retries connection errors (the openai SDK
does, twice) uploads the whole body again each time. Before this module, uvicorn
closed at once whenever the connection could not be kept (the client sent
``Connection: close``, as ``urllib`` does), and kept discarding without bound when
it could.

nginx's answer is the "lingering close", and this is the same, in two parts:

* ``CloseUnread`` (ASGI middleware): an answer that starts before the request's
  body was read whole says ``Connection: close``. The rest of that body is not
  wanted, so the connection is not kept for another request either.
* ``LingeringH11Protocol`` (uvicorn's h11 protocol): when a connection is closed
  while its request body is still arriving, the answer already written is flushed,
  the write side is shut (the client sees the answer end), and whatever still
  arrives is read and thrown away until the client closes its side, ``IDLE_S``
  pass without a byte, or ``TOTAL_S`` pass in all (nginx's ``lingering_timeout``
  and ``lingering_time``). Only then is the socket closed, and with nothing left
  unread, it closes without a reset. Nothing discarded is held in memory.

``on_linger(end, discarded_bytes)`` is told how each lingering close ended
(``eof``, ``idle``, ``deadline``, ``shutdown`` or ``lost``), for the gateway's metrics.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import h11
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

# nginx's defaults: lingering_timeout 5 s, lingering_time 30 s.
IDLE_S = 5.0
TOTAL_S = 30.0

LingerHook = Callable[[str, int], None]


class CloseUnread:
    """ASGI middleware: an answer sent before the body was read whole closes the connection."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not _has_body(scope):
            await self.app(scope, receive, send)
            return
        read = False

        async def tracked_receive() -> Message:
            nonlocal read
            message = await receive()
            if message["type"] == "http.disconnect" or not message.get("more_body", False):
                read = True
            return message

        async def closing_send(message: Message) -> None:
            if message["type"] == "http.response.start" and not read:
                headers = [(k, v) for k, v in message.get("headers", []) if k != b"connection"]
                message = {**message, "headers": [*headers, (b"connection", b"close")]}
            await send(message)

        await self.app(scope, tracked_receive, closing_send)


def _has_body(scope: Scope) -> bool:
    """Whether the request announced a body (a positive Content-Length, or chunked)."""
    for name, value in scope.get("headers", []):
        if name == b"content-length":
            return value.strip() not in (b"", b"0")
        if name == b"transfer-encoding":
            return True
    return False


def lingering_protocol(
    on_linger: LingerHook | None = None, *, idle_s: float = IDLE_S, total_s: float = TOTAL_S
) -> type[LingeringH11Protocol]:
    """A ``LingeringH11Protocol`` class for ``uvicorn.Config(http=...)``: its hook, its bounds."""
    return type(
        "LingeringH11Protocol",
        (LingeringH11Protocol,),
        {"on_linger": staticmethod(on_linger or _ignore), "idle_s": idle_s, "total_s": total_s},
    )


def _ignore(end: str, discarded: int) -> None:
    del end, discarded


class LingeringH11Protocol(H11Protocol):
    """uvicorn's h11 protocol, whose close lingers while a request body is still arriving."""

    on_linger: LingerHook = staticmethod(_ignore)
    idle_s: float = IDLE_S
    total_s: float = TOTAL_S

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.raw = transport
        self.lingering = False
        self.lost = False
        self.discarded = 0
        self.linger_started = self.last_read = 0.0
        self.linger_timer: asyncio.TimerHandle | None = None
        super().connection_made(_Transport(transport, self))

    def body_arriving(self) -> bool:
        """Whether the client is still (or may still be) sending its request body."""
        return self.conn.their_state is h11.SEND_BODY

    def linger(self) -> None:
        """Shut the write side after the answer; read and discard until a bound."""
        self.lingering = True
        self.linger_started = self.last_read = self.loop.time()
        self.raw.resume_reading()  # flow control may have paused it while the app did not read
        if self.raw.can_write_eof():
            self.raw.write_eof()  # after the buffered answer: the client sees the answer end
        self.linger_timer = self.loop.call_later(self.idle_s, self._linger_check)

    def data_received(self, data: bytes) -> None:
        if self.lingering:
            self.discarded += len(data)
            self.last_read = self.loop.time()
            return
        super().data_received(data)

    def eof_received(self) -> None:
        if self.lingering:
            self._end_linger("eof")
        super().eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if self.lingering:
            self._end_linger("lost")
        super().connection_lost(exc)

    def shutdown(self) -> None:
        if self.lingering:
            self._end_linger("shutdown")
            return
        super().shutdown()

    def _linger_check(self) -> None:
        self.linger_timer = None
        if not self.lingering:
            return
        now = self.loop.time()
        if now - self.linger_started >= self.total_s:
            self._end_linger("deadline")
        elif now - self.last_read >= self.idle_s:
            self._end_linger("idle")
        else:
            wait = min(self.last_read + self.idle_s, self.linger_started + self.total_s) - now
            self.linger_timer = self.loop.call_later(max(wait, 0.01), self._linger_check)

    def _end_linger(self, end: str) -> None:
        self.lingering = False
        if self.linger_timer is not None:
            self.linger_timer.cancel()
            self.linger_timer = None
        type(self).on_linger(end, self.discarded)
        if not self.raw.is_closing():
            self.raw.close()


class _Transport(asyncio.Transport):
    """The socket's transport as uvicorn sees it: ``close`` lingers while a body arrives."""

    def __init__(self, raw: asyncio.Transport, protocol: LingeringH11Protocol) -> None:
        super().__init__()
        self.raw = raw
        self.protocol = protocol
        self.closing = False

    def close(self) -> None:
        if self.closing:
            return
        self.closing = True
        p = self.protocol
        if p.body_arriving() and not p.lost and not self.raw.is_closing():
            p.linger()
        else:
            self.raw.close()

    def is_closing(self) -> bool:
        return self.closing or self.raw.is_closing()

    # -- everything else is the socket's own -------------------------------------------------

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self.raw.get_extra_info(name, default)

    def write(self, data: bytes | bytearray | memoryview[Any]) -> None:
        self.raw.write(data)

    def writelines(self, list_of_data: Any) -> None:
        self.raw.writelines(list_of_data)

    def write_eof(self) -> None:
        self.raw.write_eof()

    def can_write_eof(self) -> bool:
        return self.raw.can_write_eof()

    def abort(self) -> None:
        self.closing = True
        self.raw.abort()

    def pause_reading(self) -> None:
        self.raw.pause_reading()

    def resume_reading(self) -> None:
        self.raw.resume_reading()

    def is_reading(self) -> bool:
        return self.raw.is_reading()

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self.raw.set_protocol(protocol)

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self.raw.get_protocol()

    def get_write_buffer_size(self) -> int:
        return self.raw.get_write_buffer_size()

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self.raw.get_write_buffer_limits()

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self.raw.set_write_buffer_limits(high, low)
