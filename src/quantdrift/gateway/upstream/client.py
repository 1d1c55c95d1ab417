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
own limit, never a server's failure. ``sock_connect`` and ``sock_read`` are the
pool's ``connect_s`` and ``read_s`` (the longest gap between two reads). The
session is made on first use, inside the running event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

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
CALL_ERRORS = (aiohttp.ClientError, PoolBusy, TimeoutError)


def failure_name(exc: BaseException) -> str:
    """A call's failure in the words the pools compare on: ``ConnectError`` (refused,
    unreachable) and ``ConnectTimeout`` let a pool try its next server."""
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        return "ConnectTimeout"
    if isinstance(exc, aiohttp.ClientConnectorError):
        return "ConnectError"
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
    ) -> None:
        self.limit = limit
        self.acquire_s = acquire_s
        self.timeout = aiohttp.ClientTimeout(
            total=None, connect=None, sock_connect=connect_s, sock_read=read_s
        )
        self._slots = asyncio.Semaphore(limit)
        self._trace_configs = list(trace_configs)
        self._session: aiohttp.ClientSession | None = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                # The semaphore is the limit; the connector keeps every connection it made.
                connector=aiohttp.TCPConnector(limit=0, limit_per_host=0),
                timeout=self.timeout,
                trace_configs=self._trace_configs or None,
                auto_decompress=True,
            )
        return self._session

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

    async def post(self, url: str, body: Any) -> Reply:
        """POST ``body`` as JSON and read the whole reply (small replies only)."""
        async with (
            self.slot(),
            self.session.post(url, data=orjson.dumps(body), headers=JSON_HEADERS) as r,
        ):
            return Reply(r.status, await r.read())

    async def get(self, url: str) -> Reply:
        async with self.slot(), self.session.get(url) as r:
            return Reply(r.status, await r.read())

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
