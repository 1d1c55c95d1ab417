"""Any httpx transport under the pool client: an in-memory upstream, without a server.

httpx already has the two transports a test or an embedding wants, so none is written
here: ``httpx.MockTransport(handler)`` answers with a function of the request, and
``httpx.ASGITransport(app)`` runs an ASGI app (a scripted model server) in the same
process. ``HttpxTransport`` only translates: httpx's request and response to the
seam's (``transport.py``), httpx's failures to the seam's words.

What an in-process app cannot show is the wire: ``ASGITransport`` hands over the
answer once the app has finished it, so read gaps, stalls and disconnects mid-stream
are tested against a real server.

Examples
--------
>>> import asyncio, httpx
>>> seam = HttpxTransport(httpx.MockTransport(lambda r: httpx.Response(200, text="pong")))
>>> async def ask():
...     reply = await seam.request("GET", "http://m/ping", headers={})
...     return reply.status, await reply.read()
>>> asyncio.run(ask())
(200, b'pong')
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import contextmanager

import httpx

from quantdrift.gateway.upstream.transport import ConnectError, ConnectTimeout, TransportError


@contextmanager
def httpx_failures() -> Iterator[None]:
    """httpx's failures in the seam's words."""
    try:
        yield
    except httpx.ConnectTimeout as exc:
        raise ConnectTimeout(type(exc).__name__, str(exc)) from exc
    except httpx.ConnectError as exc:
        raise ConnectError(type(exc).__name__, str(exc)) from exc
    except httpx.TimeoutException as exc:
        raise TimeoutError(str(exc)) from exc
    except httpx.TransportError as exc:
        raise TransportError(type(exc).__name__, str(exc)) from exc


class HttpxTransport:
    def __init__(self, transport: httpx.AsyncBaseTransport) -> None:
        self.transport = transport

    async def request(
        self, method: str, url: str, *, content: bytes | None = None, headers: Mapping[str, str]
    ) -> HttpxResponse:
        request = httpx.Request(method, url, content=content, headers=dict(headers))
        with httpx_failures():
            return HttpxResponse(await self.transport.handle_async_request(request))

    async def aclose(self) -> None:
        await self.transport.aclose()


class HttpxResponse:
    __slots__ = ("_response",)

    def __init__(self, response: httpx.Response) -> None:
        self._response = response

    @property
    def status(self) -> int:
        return self._response.status_code

    @property
    def headers(self) -> Mapping[str, str]:
        return self._response.headers

    async def read(self) -> bytes:
        return b"".join([raw async for raw in self.chunks()])

    async def chunks(self) -> AsyncIterator[bytes]:
        with httpx_failures():
            async for raw in self._response.aiter_bytes():
                yield raw

    async def aclose(self) -> None:
        await self._response.aclose()
