"""An overloaded gateway sheds load on purpose and never blames a healthy upstream.

The overload is real: a hog on the gateway's own event loop blocks it for 0.3 s
at every turn, as a CPU-bound gateway under more requests than it can serve
does. The scripted upstreams stay healthy throughout. Before the fix, the
gateway's connect timer (0.5 s here) expired on a loopback connect the kernel
had finished at once; the gateway counted the upstream towards ejection, fell
back to the reference, which "failed" the same way, and answered 502 "every
upstream failed". Now a request is shed with a 503 ``overloaded`` and a
``Retry-After`` (counted in ``quantdrift_gateway_shed_total``): at the door while
the loop runs late, or when its own lag made an attempt time out; no fallback
is taken, no server is counted towards ejection, and once the loop is on time
again the candidate serves as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable

import aiohttp
import httpx
import pytest

from quantdrift.gateway.http.service import Gateway
from quantdrift.gateway.upstream.pools import Upstreams
from support.gateway_upstream import GOOD, Scripted, chat_body, make_config, serving

pytestmark = [pytest.mark.timeout(120)]

HOG_S = 0.3  # each turn of the loop is blocked this long: > max_loop_lag_s, < connect_s
OVERLOAD = {"max_loop_lag_s": 0.1, "tick_s": 0.02, "retry_after_s": 2}


async def until(condition: Callable[[], bool], timeout: float = 20.0) -> None:
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.01)


@contextlib.asynccontextmanager
async def hogged(start: asyncio.Event) -> AsyncIterator[None]:
    """Once ``start`` is set, block the event loop for ``HOG_S`` at every turn."""

    async def hog() -> None:
        await start.wait()
        while True:
            time.sleep(HOG_S)  # blocking on purpose: this is the overload
            await asyncio.sleep(0)

    task = asyncio.create_task(hog())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def outlier_failures(gw: Gateway) -> int:
    """Failures counted towards ejection, over every user pool."""
    pools = gw.upstreams.pools.values()
    return sum(s.failures + s.ejections for p in pools for s in p.outliers._servers.values())


def assert_shed(resp: httpx.Response) -> None:
    assert resp.status_code == 503, resp.text
    assert resp.json()["error"]["code"] == "overloaded", resp.text
    assert resp.json()["error"]["type"] == "server_error"
    assert resp.headers["retry-after"] == "2"


async def assert_served_after_the_lag(gw: Gateway, client: httpx.AsyncClient) -> None:
    """Once the loop is on time again, the candidate serves: nothing was ejected."""
    await until(lambda: not gw.loop_lag.overloaded(time.monotonic()))
    resp = await client.post("/v1/chat/completions", json=chat_body())
    assert resp.status_code == 200, resp.text
    assert resp.headers["x-quantdrift-precision"] == "int4"
    assert "x-quantdrift-fallbacks" not in resp.headers


async def test_an_overloaded_gateway_sheds_at_the_door(scripted: Scripted) -> None:
    gw = Gateway(make_config(scripted, GOOD, overload=OVERLOAD))
    async with serving(gw) as client:
        calls = len(scripted.calls)
        start = asyncio.Event()
        async with hogged(start):
            start.set()
            await until(lambda: gw.loop_lag.overloaded(time.monotonic()))
            answers = await asyncio.gather(
                client.post("/v1/chat/completions", json=chat_body()),
                client.post("/v1/chat/completions", json=chat_body(stream=True)),
                client.post("/v1/completions", json={"model": "any", "prompt": "hi"}),
            )
        for resp in answers:
            assert_shed(resp)
        assert len(scripted.calls) == calls, "a shed request reached an upstream"
        assert gw.metrics.value("quantdrift_gateway_shed_total", stage="admission") == 3
        assert gw.metrics.value("quantdrift_gateway_fallbacks_total") == 0
        assert outlier_failures(gw) == 0
        await assert_served_after_the_lag(gw, client)


def hog_on_send(start: asyncio.Event) -> aiohttp.TraceConfig:
    """Start the hog as the first upstream request goes out (a real client's own hook),
    so the overload begins after the request was let in, while it connects."""

    async def started(*_: object) -> None:
        start.set()

    trace = aiohttp.TraceConfig()
    trace.on_request_start.append(started)
    return trace


async def test_a_timeout_its_own_lag_caused_blames_no_upstream(scripted: Scripted) -> None:
    config = make_config(scripted, GOOD, overload=OVERLOAD)
    start = asyncio.Event()
    gw = Gateway(config, upstreams=Upstreams(config, trace_configs=[hog_on_send(start)]))
    async with serving(gw) as client:
        await until(lambda: not gw.loop_lag.overloaded(time.monotonic()))
        async with hogged(start):
            resp = await client.post("/v1/chat/completions", json=chat_body())
        assert_shed(resp)
        assert "x-quantdrift-fallbacks" not in resp.headers, resp.headers
        assert gw.metrics.value("quantdrift_gateway_shed_total", stage="in_flight") == 1
        assert gw.metrics.value("quantdrift_gateway_fallbacks_total") == 0
        assert outlier_failures(gw) == 0, "a healthy upstream was blamed for the gateway's lag"
        await assert_served_after_the_lag(gw, client)
