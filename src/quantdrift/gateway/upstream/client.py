"""The gateway's HTTP client to model servers: one aiohttp session per pool.

Why aiohttp: every answer reaches the gateway as a stream of small chunks (one
per token), and the client's cost per chunk is most of what a request costs the
gateway. aiohttp parses HTTP in C and hands over everything that arrived in one
read, where httpx went through h11 and six generator layers per chunk; its
connection pool takes and returns a connection in constant time, so answers
read to their end keep their connections alive instead of paying a connect
each. Measured at saturation, the same client work took about half the CPU.

``PoolClient`` bounds the connections of one pool with a semaphore, so waiting
for one has its own short timeout (``acquire_s``): ``PoolBusy`` is the gateway's
own limit, never a server's failure. Below it sits a ``Transport`` (``transport.py``):
the network's (``AiohttpTransport``, with ``sock_connect`` and ``sock_read`` the pool's
``connect_s`` and ``read_s``) unless one is given, such as an in-memory upstream.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

from quantdrift.gateway.upstream.transport import (
    AiohttpTransport,
    ConnectError,
    ConnectTimeout,
    Response,
    Transport,
    TransportError,
)

JSON_HEADERS = {"content-type": "application/json"}


class PoolBusy(Exception):
    """Every connection of the pool stayed busy for ``acquire_s``."""


@dataclass(frozen=True, slots=True)
class Reply:
    """A whole, small reply (teacher forcing, engine identity): status and body."""

    status: int
    body: bytes

    def json(self) -> Any:
        return orjson.loads(self.body)

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", "replace")


# What a call may raise (a timeout included): the caller decides what each means.
CALL_ERRORS = (TransportError, PoolBusy, TimeoutError)


def failure_name(exc: BaseException) -> str:
    """A call's failure in the words the pools compare on: ``ConnectError`` (refused,
    unreachable) and ``ConnectTimeout`` let a pool try its next server."""
    if isinstance(exc, ConnectTimeout):
        return "ConnectTimeout"
    if isinstance(exc, ConnectError):
        return "ConnectError"
    if isinstance(exc, TransportError):
        return exc.kind
    return type(exc).__name__


class PoolClient:
    """One pool's connections: at most ``limit``, a wait for one of ``acquire_s``."""

    def __init__(
        self,
        limit: int,
        *,
        connect_s: float,
        read_s: float,
        acquire_s: float,
        trace_configs: Sequence[aiohttp.TraceConfig] = (),
        transport: Transport | None = None,
    ) -> None:
        self.limit = limit
        self.acquire_s = acquire_s
        self._slots = asyncio.Semaphore(limit)
        # A given transport is shared (one in-memory upstream for every pool): its owner
        # closes it. The network's is this pool's own.
        self._owned = transport is None
        self.transport: Transport = transport or AiohttpTransport(
            connect_s=connect_s, read_s=read_s, trace_configs=trace_configs
        )

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        """Hold one of the pool's connections; ``PoolBusy`` past ``acquire_s``."""
        try:
            async with asyncio.timeout(self.acquire_s):
                await self._slots.acquire()
        except TimeoutError as exc:
            raise PoolBusy(f"every one of {self.limit} connections busy") from exc
        try:
            yield
        finally:
            self._slots.release()

    async def send(self, url: str, body: Any) -> Response:
        """POST ``body`` as JSON; the answer's body is the caller's to read and close.
        Hold a ``slot`` around it."""
        return await self.transport.request(
            "POST", url, content=orjson.dumps(body), headers=JSON_HEADERS
        )

    async def post(self, url: str, body: Any) -> Reply:
        """POST ``body`` as JSON and read the whole reply (small replies only)."""
        async with self.slot():
            return await _whole(await self.send(url, body))

    async def get(self, url: str) -> Reply:
        async with self.slot():
            return await _whole(await self.transport.request("GET", url, headers={}))

    async def aclose(self) -> None:
        if self._owned:
            await self.transport.aclose()


async def _whole(response: Response) -> Reply:
    try:
        return Reply(response.status, await response.read())
    finally:
        await response.aclose()
