"""Upstream pools by precision: one pooled httpx client, streaming calls, retries.

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
  wrong; another precision would refuse it too).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import AsyncGenerator, AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from quantdrift.errors import GatewayError, UpstreamError, UpstreamTimeout
from quantdrift.gateway.gateway_config import GatewayConfig, TimeoutConfig
from quantdrift.schemas.pair import ModelOutput

_RETRY_STATUS = frozenset({502, 503, 504})
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


@dataclass(slots=True)
class Completion:
    """One model answer, collected from a stream."""

    precision: str
    text: str = ""
    model: str = ""
    id: str = ""
    created: int = 0
    finish_reason: str | None = None
    tokens: list[str] = field(default_factory=list)
    token_logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[dict[str, float]] = field(default_factory=list)
    logprobs_content: list[dict[str, Any]] = field(default_factory=list)
    usage: dict[str, Any] | None = None
    latency_ms: float = 0.0
    url: str = ""

    def output(self) -> ModelOutput:
        """This answer as one side of a PairEvent (per-token data when the upstream sent it)."""
        aligned = bool(self.tokens) and len(self.tokens) == len(self.token_logprobs)
        return ModelOutput(
            text=self.text,
            model=self.model,
            precision=self.precision,
            tokens=self.tokens if aligned else None,
            token_logprobs=self.token_logprobs if aligned else None,
            top_logprobs=self.top_logprobs if aligned and self.top_logprobs else None,
            latency_ms=round(self.latency_ms, 3),
            finish_reason=self.finish_reason,
        )


class Accumulator:
    """Folds streamed chunks into a Completion; ``add`` returns what the chunk brought."""

    def __init__(self, precision: str) -> None:
        self.completion = Completion(precision)
        self._parts: list[str] = []
        self._t0 = time.perf_counter()
        self.content_chunks = 0

    def add(self, chunk: Mapping[str, Any]) -> tuple[str, list[dict[str, float]]]:
        c = self.completion
        c.id = c.id or str(chunk.get("id") or "")
        c.model = c.model or str(chunk.get("model") or "")
        c.created = c.created or int(chunk.get("created") or 0)
        if isinstance(chunk.get("usage"), dict):
            c.usage = chunk["usage"]
        choices = chunk.get("choices") or []
        if not choices or not isinstance(choices[0], dict):
            return "", []
        choice = choices[0]
        delta = choice.get("delta") or choice.get("message") or {}
        text = delta.get("content") or "" if isinstance(delta, dict) else ""
        if not isinstance(text, str):
            text = ""
        if text:
            self._parts.append(text)
            self.content_chunks += 1
        if choice.get("finish_reason"):
            c.finish_reason = str(choice["finish_reason"])
        tops: list[dict[str, float]] = []
        logprobs = choice.get("logprobs")
        content = logprobs.get("content") if isinstance(logprobs, dict) else None
        for entry in content or ():
            if not isinstance(entry, dict):
                continue
            top: dict[str, float] = {}
            for alt in entry.get("top_logprobs") or ():
                if isinstance(alt, dict) and isinstance(alt.get("logprob"), int | float):
                    tok, lp = str(alt.get("token", "")), float(alt["logprob"])
                    top[tok] = max(lp, top.get(tok, lp))
            c.tokens.append(str(entry.get("token", "")))
            chosen = entry.get("logprob")
            c.token_logprobs.append(float(chosen) if isinstance(chosen, int | float) else 0.0)
            c.top_logprobs.append(top)
            c.logprobs_content.append(entry)
            tops.append(top)
        return text, tops

    def finish(self) -> Completion:
        self.completion.text = "".join(self._parts)
        self.completion.latency_ms = (time.perf_counter() - self._t0) * 1000.0
        return self.completion

    @property
    def text(self) -> str:
        return "".join(self._parts)


def _as_chunk(body: Mapping[str, Any]) -> dict[str, Any]:
    """A non-streamed chat.completion as one stream chunk."""
    choices = []
    for choice in body.get("choices") or ():
        if isinstance(choice, dict):
            message = choice.get("message") or {}
            choices.append(
                {
                    "index": choice.get("index", 0),
                    "delta": {"role": "assistant", "content": message.get("content") or ""},
                    "logprobs": choice.get("logprobs"),
                    "finish_reason": choice.get("finish_reason"),
                }
            )
    return {**body, "object": "chat.completion.chunk", "choices": choices}


class UpstreamPool:
    """The URLs of one precision; requests start at a rotating URL to spread load."""

    def __init__(
        self,
        precision: str,
        urls: Sequence[str],
        client: httpx.AsyncClient,
        timeouts: TimeoutConfig,
        model: str | None = None,
    ) -> None:
        self.precision = precision
        self.urls = [u.rstrip("/") for u in urls]
        self.model = model
        self._client = client
        self._timeouts = timeouts
        self._next = itertools.count()

    def _ordered(self) -> list[str]:
        start = next(self._next) % len(self.urls)
        return self.urls[start:] + self.urls[:start]

    async def stream(
        self, body: Mapping[str, Any], *, total_s: float | None = None
    ) -> AsyncGenerator[dict[str, Any], None]:
        """Yield the chunks of one streamed completion (see the module docstring for errors)."""
        payload = dict(body, stream=True)
        if self.model:
            payload["model"] = self.model
        deadline = time.monotonic() + (total_s or self._timeouts.total_s)
        failures: list[str] = []
        for url in self._ordered():
            try:
                response = await self._client.send(
                    self._client.build_request("POST", f"{url}/v1/chat/completions", json=payload),
                    stream=True,
                )
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                failures.append(f"{url}: {type(exc).__name__}")
                continue
            except httpx.TimeoutException as exc:
                raise _error(f"{self.precision}: {url} timed out", "timeout", True) from exc
            except httpx.HTTPError as exc:
                raise _error(f"{self.precision}: {url}: {exc!r}", "disconnect") from exc
            try:
                if response.status_code >= 400:
                    detail = await _read_error(response)
                    if response.status_code in _RETRY_STATUS:
                        failures.append(f"{url}: HTTP {response.status_code}")
                        continue
                    if response.status_code < 500:
                        raise UpstreamClientError(response.status_code, detail)
                    raise _error(
                        f"{self.precision}: {url} answered {response.status_code}",
                        f"http_{response.status_code}",
                    )
                async for chunk in self._chunks(response, url, deadline):
                    yield chunk
                return
            finally:
                await response.aclose()
        reason = "http_5xx" if any("HTTP" in f for f in failures) else "connect"
        raise _error(f"{self.precision}: every upstream failed ({'; '.join(failures)})", reason)

    async def _chunks(
        self, response: httpx.Response, url: str, deadline: float
    ) -> AsyncIterator[dict[str, Any]]:
        try:
            if "json" in response.headers.get("content-type", ""):
                body = json.loads(await response.aread())
                if not isinstance(body, dict):
                    raise _error(f"{self.precision}: {url}: not a completion", "bad_response")
                yield _as_chunk(body)
                return
            async for line in response.aiter_lines():
                if time.monotonic() > deadline:
                    raise _error(f"{self.precision}: {url}: attempt too long", "timeout", True)
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    return
                chunk = json.loads(data)
                if not isinstance(chunk, dict):
                    raise _error(f"{self.precision}: {url}: bad chunk", "bad_response")
                if "error" in chunk and not chunk.get("choices"):
                    message = str((chunk.get("error") or {}).get("message", "error"))
                    raise _error(f"{self.precision}: {url}: {message}", "stream_error")
                yield chunk
        except httpx.TimeoutException as exc:
            raise _error(f"{self.precision}: {url} stopped answering", "timeout", True) from exc
        except httpx.HTTPError as exc:
            raise _error(f"{self.precision}: {url}: {type(exc).__name__}", "disconnect") from exc
        except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
            raise _error(f"{self.precision}: {url}: unreadable chunk", "bad_response") from exc

    async def score(
        self, messages: Any, continuation: str, *, timeout_s: float
    ) -> list[float] | None:
        """Teacher-forced log-probs of ``continuation`` (``POST /v1/score``); None on failure."""
        for url in self._ordered():
            try:
                async with asyncio.timeout(timeout_s):
                    response = await self._client.post(
                        f"{url}/v1/score", json={"messages": messages, "continuation": continuation}
                    )
            except (httpx.ConnectError, httpx.ConnectTimeout):
                continue
            except (httpx.HTTPError, TimeoutError):
                return None
            if response.status_code != 200:
                return None
            try:
                values = response.json().get("continuation_logprobs")
            except (ValueError, AttributeError):
                return None
            if isinstance(values, list) and all(isinstance(v, int | float) for v in values):
                return [float(v) for v in values]
            return None
        return None


async def _read_error(response: httpx.Response) -> Any:
    try:
        raw = await response.aread()
    except httpx.HTTPError:
        return None
    raw = raw[:_MAX_ERROR_BODY]
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode("utf-8", "replace")


class Upstreams:
    """Every precision's pool over one pooled ``httpx.AsyncClient``."""

    def __init__(
        self,
        config: GatewayConfig,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        t = config.timeouts
        self.client = httpx.AsyncClient(
            timeout=httpx.Timeout(t.read_s, connect=t.connect_s),
            limits=httpx.Limits(
                max_connections=config.max_connections,
                max_keepalive_connections=config.max_connections,
            ),
            transport=transport,
        )
        models = config.precision_models
        self.pools = {
            name: UpstreamPool(name, urls, self.client, t, models.get(name))
            for name, urls in config.precisions.items()
        }

    def __getitem__(self, precision: str) -> UpstreamPool:
        return self.pools[precision]

    async def aclose(self) -> None:
        await self.client.aclose()
