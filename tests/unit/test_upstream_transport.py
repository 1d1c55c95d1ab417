"""The transport seam under the pool client: each way a call fails, in the seam's words,
and what the pool makes of it.

The handlers are ``httpx.MockTransport``'s (httpx's own in-memory transport): each
raises the failure a network would, so these check the pool's logic, not a socket.
One check runs the network's transport against a closed port on this machine.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import httpx
import pytest

from quantdrift.errors import UpstreamError, UpstreamTimeout
from quantdrift.gateway.gateway_config import TimeoutConfig
from quantdrift.gateway.upstream.client import PoolClient, failure_name
from quantdrift.gateway.upstream.httpx_transport import HttpxTransport
from quantdrift.gateway.upstream.pools import UpstreamPool, error_reason
from quantdrift.gateway.upstream.transport import AiohttpTransport, ConnectError
from quantdrift.stack import free_port

TIMEOUTS = TimeoutConfig(connect_s=1, read_s=1, total_s=5)
SSE = (
    'data: {"choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": "stop"}]}\n\n'
    "data: [DONE]\n\n"
)


def pool(handler: Callable[[httpx.Request], httpx.Response], *urls: str) -> UpstreamPool:
    client = PoolClient(
        2,
        connect_s=1,
        read_s=1,
        acquire_s=1,
        transport=HttpxTransport(httpx.MockTransport(handler)),
    )
    return UpstreamPool("int4", list(urls) or ["http://a"], client, TIMEOUTS)


async def chunks(p: UpstreamPool) -> list[dict]:
    return [c async for c in p.stream({"messages": [{"role": "user", "content": "x"}]})]


def raising(exc: type[httpx.TransportError]) -> Callable[[httpx.Request], httpx.Response]:
    def handler(request: httpx.Request) -> httpx.Response:
        raise exc("scripted", request=request)

    return handler


async def test_a_streamed_answer_arrives_through_the_seam() -> None:
    seen: list[dict] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(json.loads(request.content))
        return httpx.Response(200, text=SSE, headers={"content-type": "text/event-stream"})

    got = await chunks(pool(handler))
    assert [c["choices"][0]["delta"]["content"] for c in got] == ["hi"]
    assert seen[0]["stream"] is True  # the pool shaped the payload it sent


async def test_refused_then_answered_tries_the_next_server() -> None:
    hosts: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        hosts.append(request.url.host)
        if request.url.host == "down":
            raise httpx.ConnectError("refused", request=request)
        return httpx.Response(200, text=SSE, headers={"content-type": "text/event-stream"})

    p = pool(handler, "http://down", "http://up")
    for _ in range(2):  # the rotation starts at each server once
        assert len(await chunks(p)) == 1
    assert hosts == ["down", "up", "up"]


@pytest.mark.parametrize(
    ("exc", "error", "reason"),
    [
        (httpx.ConnectError, UpstreamError, "connect"),
        (httpx.ConnectTimeout, UpstreamError, "connect"),
        (httpx.ReadTimeout, UpstreamTimeout, "timeout"),
        (httpx.RemoteProtocolError, UpstreamError, "disconnect"),
    ],
)
async def test_each_failure_is_told_apart(
    exc: type[httpx.TransportError], error: type[UpstreamError], reason: str
) -> None:
    with pytest.raises(error) as failed:
        await chunks(pool(raising(exc)))
    assert error_reason(failed.value) == reason


async def test_a_5xx_is_the_servers_and_a_4xx_is_the_callers() -> None:
    def status(code: int) -> Callable[[httpx.Request], httpx.Response]:
        return lambda _: httpx.Response(code, json={"error": {"message": "no"}})

    with pytest.raises(UpstreamError) as failed:
        await chunks(pool(status(500)))
    assert error_reason(failed.value) == "http_500"
    with pytest.raises(Exception, match="upstream answered 400") as refused:
        await chunks(pool(status(400)))
    assert refused.value.body == {"error": {"message": "no"}}  # type: ignore[attr-defined]


async def test_small_replies_name_their_failure_in_the_seams_words() -> None:
    client = PoolClient(
        1,
        connect_s=1,
        read_s=1,
        acquire_s=1,
        transport=HttpxTransport(httpx.MockTransport(raising(httpx.ConnectTimeout))),
    )
    with pytest.raises(Exception) as failed:
        await client.get("http://a/version")
    assert failure_name(failed.value) == "ConnectTimeout"


async def test_the_network_transport_says_refused_for_a_closed_port() -> None:
    transport = AiohttpTransport(connect_s=1, read_s=1)
    try:
        with pytest.raises(ConnectError) as refused:
            await transport.request("GET", f"http://127.0.0.1:{free_port()}/", headers={})
        assert failure_name(refused.value) == "ConnectError"
    finally:
        await transport.aclose()
