"""Upstream pools by precision: one client per pool (``client``), streaming calls, retries.

Each pool has its own connection limit and a short pool-acquire timeout
(``pools.P.max_connections`` / ``acquire_timeout_s``): a saturated INT4 pool
answers "busy" in half a second (reason ``pool_timeout``) and the request falls
back, instead of queueing behind every other request. Servers that keep failing
are ejected for a while (``capacity.OutlierDetector``). The payload sent to a
pool is shaped by what it declared it can do (``PoolConfig``): no ``logprobs``
for a pool without them, ``stream_options.include_usage`` where it is honoured.
Shadow traffic gets its own ``Upstreams`` (own clients, own limits), so it can
never take a user's connection.

Every call to a model goes out as a *streaming* chat completion, whatever the
user asked for: the JSON and degeneration guards can then cut a bad answer the
moment it goes wrong, instead of paying for the whole generation. A non-streamed
user request is answered from the collected stream (``Accumulator``). An upstream
that ignores ``stream`` and answers with one JSON body is accepted too.

Failures, and what the pool does with them:

* connect errors (refused, unreachable, connect timeout) and 502/503/504 before
  any byte: the next URL of the pool is tried; when every URL failed the pool
  raises ``UpstreamError`` (reason ``connect`` or ``http_5xx``);
* any other 5xx: ``UpstreamError`` (reason ``http_500`` ...), no retry on the
  same pool (the gateway falls back to the next precision);
* a read timeout, or the attempt's total time exceeded: ``UpstreamTimeout``;
* the connection dropped mid-stream or unreadable SSE: ``UpstreamError``
  (``disconnect`` / ``bad_response``);
* 4xx: ``UpstreamClientError``, passed through to the user as is (the request is
  wrong; another precision would refuse it too);
* any timeout while the gateway's own event loop ran late (``overload.LoopLag``):
  ``GatewayOverloaded``, and the server is not counted towards ejection.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import orjson

from quantdrift.errors import GatewayError, GatewayOverloaded, UpstreamError, UpstreamTimeout
from quantdrift.gateway.gateway_config import GatewayConfig, PoolConfig, TimeoutConfig
from quantdrift.gateway.guards.capacity import OutlierDetector
from quantdrift.gateway.guards.overload import LoopLag
from quantdrift.gateway.openai_wire import Completion, as_chunk
from quantdrift.gateway.upstream import teacher_forcing as tf
from quantdrift.gateway.upstream.client import PoolBusy, PoolClient
from quantdrift.gateway.upstream.engines import identify
from quantdrift.gateway.upstream.teacher_forcing import Failed, Outcome
from quantdrift.gateway.upstream.transport import (
    ConnectError,
    ConnectTimeout,
    Response,
    Transport,
    TransportError,
)
from quantdrift.schemas.pair import EngineInfo

_RETRY_STATUS = frozenset({502, 503, 504})
_DONE: dict[str, Any] = {}  # the end of a stream (``data: [DONE]``), told apart by identity
_MAX_ERROR_BODY = 4096


class UpstreamClientError(GatewayError):
    """The upstream refused the request (4xx): the user gets its status and body."""

    def __init__(self, status: int, body: Any) -> None:
        super().__init__(f"upstream answered {status}")
        self.status = status
        self.body = body


def _error(message: str, reason: str, timeout: bool = False) -> UpstreamError:
    exc: UpstreamError = UpstreamTimeout(message) if timeout else UpstreamError(message)
    exc.reason = reason  # type: ignore[attr-defined]
    return exc


def error_reason(exc: UpstreamError) -> str:
    """The short reason of a pool failure, for metrics: connect, timeout, http_500, ..."""
    return str(getattr(exc, "reason", "timeout" if isinstance(exc, UpstreamTimeout) else "error"))


class UpstreamPool:
    """The URLs of one precision; requests start at a rotating URL to spread load."""

    def __init__(
        self,
        precision: str,
        urls: Sequence[str],
        client: PoolClient,
        timeouts: TimeoutConfig,
        model: str | None = None,
        capabilities: PoolConfig | None = None,
        outliers: OutlierDetector | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.precision = precision
        self.urls = [u.rstrip("/") for u in urls]
        self.model = model
        self.capabilities = capabilities or PoolConfig()
        self.outliers = outliers or OutlierDetector()
        self._client = client
        self._timeouts = timeouts
        self._next = itertools.count()
        self._clock = clock
        # The gateway's loop-lag monitor (``Upstreams.attribute_lag``): None, no attribution.
        self.lag: LoopLag | None = None

    @property
    def hosts(self) -> list[str]:
        """``host:port`` of every server (what error messages must not show users)."""
        return [urlsplit(u).netloc.rpartition("@")[2] for u in self.urls]

    def _ordered(self) -> list[str]:
        start = next(self._next) % len(self.urls)
        ordered = self.urls[start:] + self.urls[:start]
        return self.outliers.available(ordered, self._clock())

    def shape(self, body: Mapping[str, Any], *, chat: bool = True) -> dict[str, Any]:
        """The payload this pool gets: streaming, capabilities applied, its model name;
        token ids asked for on a chat with log-probs where the pool reports them (what
        teacher forcing by ids reads; ``openai_wire.client_chunk`` strips them)."""
        cap = self.capabilities
        payload = dict(body, stream=True)
        if chat and cap.token_ids and payload.get("logprobs"):
            payload["return_token_ids"] = True
        if self.model:
            payload["model"] = self.model
        if not cap.logprobs:
            payload.pop("logprobs", None)
            payload.pop("top_logprobs", None)
        elif isinstance(payload.get("top_logprobs"), int):
            payload["top_logprobs"] = min(payload["top_logprobs"], cap.max_top_logprobs)
        if cap.stream_usage:
            payload["stream_options"] = {"include_usage": True}
        else:
            payload.pop("stream_options", None)
        return payload

    def _failed(self, url: str) -> None:
        self.outliers.failure(url, self._clock())

    def _own_lag(self, started: float, exc: Exception) -> None:
        """Raise ``GatewayOverloaded`` when a timeout is the gateway's own: its event loop
        ran late while the attempt waited, so the clock that expired measured the
        gateway, not the server. No ejection, no fallback (it would double the work)."""
        if self.lag is not None and self.lag.late_since(started, self._clock()):
            raise GatewayOverloaded(
                f"{self.precision}: timed out while the gateway's event loop ran late"
            ) from exc

    async def stream(
        self,
        body: Mapping[str, Any],
        *,
        total_s: float | None = None,
        path: str = "/v1/chat/completions",
    ) -> AsyncGenerator[dict[str, Any], None]:
        """Yield the chunks of one streamed completion (see the module docstring for errors)."""
        payload = self.shape(body, chat=path == "/v1/chat/completions")
        deadline = time.monotonic() + (total_s or self._timeouts.total_s)
        failures: list[str] = []
        for url in self._ordered():
            started = self._clock()
            async with contextlib.AsyncExitStack() as held:
                try:
                    await held.enter_async_context(self._client.slot())
                except PoolBusy as exc:
                    # Our own limit, not the server's fault: no ejection, fall back.
                    raise _error(
                        f"{self.precision}: every connection busy", "pool_timeout"
                    ) from exc
                try:
                    async with asyncio.timeout_at(_loop_time(deadline)):
                        response = await self._client.send(f"{url}{path}", payload)
                except ConnectTimeout as exc:
                    self._own_lag(started, exc)
                    self._failed(url)
                    failures.append(f"{url}: ConnectTimeout")
                    continue
                except ConnectError:  # refused, unreachable: the server's
                    self._failed(url)
                    failures.append(f"{url}: ConnectError")
                    continue
                except TimeoutError as exc:  # no headers within read_s, or the deadline passed
                    self._own_lag(started, exc)
                    self._failed(url)
                    raise _error(f"{self.precision}: {url} timed out", "timeout", True) from exc
                except TransportError as exc:
                    self._failed(url)
                    raise _error(f"{self.precision}: {url}: {exc!r}", "disconnect") from exc
                # Back to the pool if read whole, else closed.
                held.push_async_callback(response.aclose)
                if response.status >= 400:
                    detail = await _read_error(response)
                    if response.status in _RETRY_STATUS:
                        self._failed(url)
                        failures.append(f"{url}: HTTP {response.status}")
                        continue
                    if response.status < 500:
                        raise UpstreamClientError(response.status, detail)
                    self._failed(url)
                    raise _error(
                        f"{self.precision}: {url} answered {response.status}",
                        f"http_{response.status}",
                    )
                try:
                    async for chunk in self._chunks(response, url, deadline):
                        yield chunk
                except UpstreamTimeout as exc:
                    self._own_lag(started, exc)
                    self._failed(url)
                    raise
                except UpstreamError:
                    self._failed(url)
                    raise
                self.outliers.success(url)
                return
        reason = "http_5xx" if any("HTTP" in f for f in failures) else "connect"
        raise _error(f"{self.precision}: every upstream failed ({'; '.join(failures)})", reason)

    async def _chunks(
        self, response: Response, url: str, deadline: float
    ) -> AsyncIterator[dict[str, Any]]:
        try:
            if "json" in response.headers.get("content-type", ""):
                body = orjson.loads(await response.read())
                if not isinstance(body, dict):
                    raise _error(f"{self.precision}: {url}: not a completion", "bad_response")
                yield as_chunk(body)
                return
            # Whatever arrived in one read, split into lines on bytes and parsed by orjson
            # from bytes: no text or line decoder per chunk.
            rest, done = b"", False
            async for raw in response.chunks():
                *lines, rest = (rest + raw).split(b"\n")
                for line in lines:
                    if done:
                        continue  # read on to the end: the connection goes back to the pool
                    chunk = self._event(line, url, deadline)
                    if chunk is _DONE:
                        done = True
                    elif chunk is not None:
                        yield chunk
            chunk = None if done else self._event(rest, url, deadline)
            if chunk is not None and chunk is not _DONE:
                yield chunk
        except TimeoutError as exc:  # sock_read: no byte for read_s
            raise _error(f"{self.precision}: {url} stopped answering", "timeout", True) from exc
        except TransportError as exc:
            raise _error(f"{self.precision}: {url}: {exc.kind}", "disconnect") from exc
        except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
            raise _error(f"{self.precision}: {url}: unreadable chunk", "bad_response") from exc

    def _event(self, line: bytes, url: str, deadline: float) -> dict[str, Any] | None:
        """One SSE line: its chunk, ``_DONE`` at ``[DONE]``, None for anything but data."""
        if time.monotonic() > deadline:
            raise _error(f"{self.precision}: {url}: attempt too long", "timeout", True)
        if not line.startswith(b"data:"):
            return None
        data = line[5:].strip()
        if data == b"[DONE]":
            return _DONE
        chunk = orjson.loads(data)
        if not isinstance(chunk, dict):
            raise _error(f"{self.precision}: {url}: bad chunk", "bad_response")
        if "error" in chunk and not chunk.get("choices"):
            message = str((chunk.get("error") or {}).get("message", "error"))
            raise _error(f"{self.precision}: {url}: {message}", "stream_error")
        return chunk

    async def score(
        self, messages: Any, candidate: Completion, *, timeout_s: float, top_k: int = 1
    ) -> Outcome:
        """The reference's log-probs of ``candidate``'s tokens, the way this pool declared
        (``teacher_forcing``; see ``teacher_forcing``): by the candidate's own token ids
        where it reported them, else by re-tokenizing its text, with the reference's
        top-``top_k`` at each position. Tries the pool's URLs in turn while they refuse
        connections; never raises."""
        mode = self.capabilities.teacher_forcing
        if mode == "none":
            return Failed(tf.UNSUPPORTED, f"pool {self.precision} declares teacher_forcing: none")
        tokens = [str(e.get("token", "")) for e in candidate.choice(0).logprobs_content]
        ids, prompt_ids = candidate.choice(0).token_ids, candidate.prompt_token_ids
        outcome: Outcome = Failed(tf.FAILED, f"{self.precision}: no upstream answered")
        for url in self._ordered():
            if mode == "vllm" and ids and prompt_ids:
                outcome = await tf.score_vllm_ids(
                    self._client, url, self.model, prompt_ids, ids, timeout_s, top_k
                )
            elif mode == "vllm":
                outcome = await tf.score_vllm(
                    self._client,
                    url,
                    self.model,
                    messages,
                    candidate.text,
                    tokens,
                    finished=candidate.finish_reason == "stop",
                    timeout_s=timeout_s,
                    top_k=top_k,
                )
            else:
                outcome = await tf.score_lab(
                    self._client, url, messages, candidate.text, timeout_s, top_k
                )
            if not (isinstance(outcome, Failed) and outcome.detail in _CONNECT_FAILURES):
                return outcome
        return outcome

    async def probe_teacher_forcing(self, timeout_s: float) -> Outcome:
        """One tiny forced answer on the first reachable server (startup check)."""
        outcome: Outcome = Failed(tf.FAILED, f"{self.precision}: no upstream answered")
        for url in self.urls:
            mode = self.capabilities.teacher_forcing
            outcome = await tf.probe(self._client, url, self.model, mode, timeout_s)
            if not (isinstance(outcome, Failed) and outcome.detail in _CONNECT_FAILURES):
                return outcome
        return outcome

    async def identify(self) -> EngineInfo:
        """What serves the pool's first server (``engines.identify``)."""
        return await identify(self._client, self.urls[0])


_CONNECT_FAILURES = frozenset({"ConnectError", "ConnectTimeout"})


def _loop_time(deadline: float) -> float:
    """A ``time.monotonic`` deadline on the event loop's clock."""
    return asyncio.get_running_loop().time() + (deadline - time.monotonic())


async def _read_error(response: Response) -> Any:
    try:
        raw = (await response.read())[:_MAX_ERROR_BODY]
    except (TransportError, TimeoutError):
        return None
    try:
        return orjson.loads(raw)
    except ValueError:
        return raw.decode("utf-8", "replace")


class Upstreams:
    """Every precision's pool, each over its own ``client.PoolClient`` and limit.

    ``shadow=True`` builds the shadow side's set: the same servers, separate
    clients, ``shadow_max_connections`` per pool, no outlier ejection shared with
    users (a reference that is slow for shadows must not be ejected for users).
    ``transport``: one for every pool's client instead of the network (``transport.py``).
    """

    def __init__(
        self,
        config: GatewayConfig,
        *,
        trace_configs: Sequence[aiohttp.TraceConfig] = (),
        shadow: bool = False,
        transport: Transport | None = None,
    ) -> None:
        t = config.timeouts
        o = config.outlier
        models = config.precision_models
        self.clients: list[PoolClient] = []
        self.pools: dict[str, UpstreamPool] = {}
        for name, urls in config.precisions.items():
            cap = config.pool(name)
            limit = config.shadow_max_connections if shadow else config.pool_connections(name)
            client = PoolClient(
                limit,
                connect_s=t.connect_s,
                read_s=t.read_s,
                acquire_s=t.shadow_total_s if shadow else cap.acquire_timeout_s,
                trace_configs=trace_configs,
                transport=transport,
            )
            self.clients.append(client)
            detector = OutlierDetector(o.consecutive_failures, o.base_ejection_s, o.max_ejection_s)
            self.pools[name] = UpstreamPool(name, urls, client, t, models.get(name), cap, detector)

    def __getitem__(self, precision: str) -> UpstreamPool:
        return self.pools[precision]

    @property
    def hosts(self) -> list[str]:
        return [h for p in self.pools.values() for h in p.hosts]

    def attribute_lag(self, lag: LoopLag) -> None:
        """Let every pool tell the gateway's own lag from a slow server (``overload.py``)."""
        for pool in self.pools.values():
            pool.lag = lag

    def ejected(self) -> int:
        return sum(p.outliers.ejected_total for p in self.pools.values())

    async def aclose(self) -> None:
        for client in self.clients:
            await client.aclose()
