"""The seam under the pool client: how one request reaches a model server and back.

``PoolClient`` (``client.py``) owns what the gateway decides about a call (the pool's
connection limit, the wait for a connection); a ``Transport`` only moves bytes. The
network's is ``AiohttpTransport``, the default; ``httpx_transport.HttpxTransport`` puts
any httpx transport under the same seam (``httpx.MockTransport`` for a handler,
``httpx.ASGITransport`` for an app in the same process), so a test of the gateway's own
logic runs without a server. A test about the wire keeps a real one.

A transport says how a call failed in the seam's words, whatever its library:

* ``ConnectError``: refused or unreachable (the pool may try its next server);
* ``ConnectTimeout``: no connection within ``connect_s`` (likewise);
* ``TimeoutError`` (the builtin): no byte within ``read_s``;
* ``TransportError``: anything else that broke the exchange (a disconnect).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Protocol

import aiohttp


class TransportError(Exception):
    """The exchange broke; ``kind`` names what the library said (for logs, metrics)."""

    def __init__(self, kind: str, detail: str = "") -> None:
        super().__init__(f"{kind}: {detail}" if detail else kind)
        self.kind = kind


class ConnectError(TransportError):
    """Refused or unreachable: the server's failure, before a byte was sent."""


class ConnectTimeout(TransportError):
    """No connection within the pool's ``connect_s``."""


class Response(Protocol):
    """An answer whose body is read once: whole (``read``) or as it arrives (``chunks``)."""

    @property
    def status(self) -> int: ...

    @property
    def headers(self) -> Mapping[str, str]: ...

    async def read(self) -> bytes: ...

    def chunks(self) -> AsyncIterator[bytes]:
        """Whatever arrived in one read, as it arrives."""
        ...

    async def aclose(self) -> None:
        """Done with it: the connection goes back to the pool if the body was read whole."""
        ...


class Transport(Protocol):
    async def request(
        self, method: str, url: str, *, content: bytes | None = None, headers: Mapping[str, str]
    ) -> Response: ...

    async def aclose(self) -> None: ...


@contextmanager
def aiohttp_failures() -> Iterator[None]:
    """aiohttp's failures in the seam's words (its read timeouts are TimeoutErrors)."""
    try:
        yield
    except aiohttp.ConnectionTimeoutError as exc:
        raise ConnectTimeout(type(exc).__name__, str(exc)) from exc
    except aiohttp.ClientConnectorError as exc:
        raise ConnectError(type(exc).__name__, str(exc)) from exc
    except TimeoutError:
        raise
    except aiohttp.ClientError as exc:
        raise TransportError(type(exc).__name__, str(exc)) from exc


class AiohttpTransport:
    """The network: one aiohttp session (made on first use, inside the running loop).

    ``sock_connect`` and ``sock_read`` are the pool's ``connect_s`` and ``read_s`` (the
    longest gap between two reads); the pool client's semaphore is the connection limit,
    so the connector keeps every connection it made.
    """

    def __init__(
        self,
        *,
        connect_s: float,
        read_s: float,
        trace_configs: Sequence[aiohttp.TraceConfig] = (),
    ) -> None:
        self.timeout = aiohttp.ClientTimeout(
            total=None, connect=None, sock_connect=connect_s, sock_read=read_s
        )
        self._trace_configs = list(trace_configs)
        self._session: aiohttp.ClientSession | None = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0, limit_per_host=0),
                timeout=self.timeout,
                trace_configs=self._trace_configs or None,
                auto_decompress=True,
            )
        return self._session

    async def request(
        self, method: str, url: str, *, content: bytes | None = None, headers: Mapping[str, str]
    ) -> AiohttpResponse:
        with aiohttp_failures():
            response = await self.session.request(method, url, data=content, headers=headers)
        return AiohttpResponse(response)

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


class AiohttpResponse:
    __slots__ = ("_response",)

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self._response = response

    @property
    def status(self) -> int:
        return self._response.status

    @property
    def headers(self) -> Mapping[str, str]:
        return self._response.headers

    async def read(self) -> bytes:
        with aiohttp_failures():
            return await self._response.read()

    async def chunks(self) -> AsyncIterator[bytes]:
        with aiohttp_failures():
            async for raw in self._response.content.iter_any():
                yield raw

    async def aclose(self) -> None:
        self._response.release()
