"""The reference gateway: an OpenAI-compatible server in front of precision pools.

``POST /v1/chat/completions`` (streaming and not), ``GET /health``, ``GET /metrics``.

Per request:

1. Route: header ``X-Quantdrift-Route``, else body ``route``, else the body's
   ``model`` when it names a route, else ``default_route``. Preference: body
   ``precision_preference`` or header ``X-Precision-Preference``, else the
   configured default. ``routing.decide`` turns route, preference and the
   RouteController's current command into the serving precision, the fallback
   chain and the shadow side.
2. The answer: every upstream call streams. A request that asks for JSON
   (``response_format`` json_object / json_schema, or ``expected_keys``) is
   guarded by ``JsonGuard`` and the degeneration probe; the moment either fails,
   the upstream stream is cut and the request is retried on the next precision
   of the chain, silently; a ``DegradationEvent`` goes to the degradations topic
   and ``quantdrift_gateway_fallbacks_total`` counts it. A streamed JSON answer
   is buffered until it is complete and valid, then sent as one clean stream. A
   streamed non-JSON answer is held back for its first ``stream_holdback_tokens``
   tokens (so an early loop, collapse or upstream failure still falls back
   silently), then forwarded as it comes; a loop detected after that stops the
   generation (finish_reason ``length``) and is recorded, since the user has
   already seen the start. Upstream failures (connect, 5xx, timeout, disconnect)
   fall back along the same chain; when everything fails the user gets an
   OpenAI-style error, 504 if every failure was a timeout, else 502. The last
   precision of the chain is never cut by a guard: its answer is the best there
   is, and is returned as the model gave it.
3. Shadow: a deterministic sample (``sampling.sampled`` on the request id) also
   runs on the other side, in a background task started after the user's answer
   is done, and the pair goes to ``ShadowPublisher.offer`` (never blocks). A
   second sample runs twice on the reference (``kind=noise``; the second call at
   temperature 0.7 if the request was greedy). With ``teacher_forced`` the
   reference's ``/v1/score`` gives its log-probs on the candidate's text.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from quantdrift.config import KafkaSettings
from quantdrift.detectors.json_contract import check_json_contract
from quantdrift.errors import SchemaError, UpstreamError, UpstreamTimeout
from quantdrift.gateway.controller import RouteController
from quantdrift.gateway.degeneration import DegenerationProbe
from quantdrift.gateway.gateway_config import GatewayConfig
from quantdrift.gateway.json_guard import JsonGuard, guard_for
from quantdrift.gateway.publisher import ShadowPublisher
from quantdrift.gateway.routing import PREFERENCES, Decision, RouteState, decide
from quantdrift.gateway.sampling import sampled
from quantdrift.gateway.upstreams import (
    Accumulator,
    Completion,
    UpstreamClientError,
    Upstreams,
    error_reason,
)
from quantdrift.schemas.degradation import DegradationEvent
from quantdrift.schemas.pair import PairEvent, RequestInfo

log = logging.getLogger(__name__)

ROUTE_HEADER = "x-quantdrift-route"
PREFERENCE_HEADER = "x-precision-preference"
NOISE_SALT = "noise:"
NOISE_TEMPERATURE = 0.7
_EXTENSIONS = ("precision_preference", "expected_keys", "route")


# -- small pieces ----------------------------------------------------------------


class DegradationPublisher(ShadowPublisher):
    """ShadowPublisher's non-blocking, bounded produce path, for DegradationEvents."""

    def __init__(self, kafka: KafkaSettings, topic: str | None = None, queue_size: int = 1000):
        super().__init__(kafka, 1.0, queue_size, topic or kafka.topics.degradations)

    def send(self, event: DegradationEvent) -> bool:
        """Queue one event; never blocks, never raises."""
        return self.offer(event)  # type: ignore[arg-type]

    def _encode(self, item: Any) -> tuple[bytes, bytes]:
        if isinstance(item, DegradationEvent):
            return item.route.encode(), item.dumps()
        raise SchemaError(f"expected a DegradationEvent, got {type(item).__name__}")


class Metrics:
    """Counters in Prometheus text format; labels are small, fixed sets."""

    def __init__(self) -> None:
        self._counters: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
        self._help: dict[str, str] = {}

    def inc(self, name: str, help_: str = "", n: float = 1, **labels: str) -> None:
        series = self._counters.setdefault(name, {})
        key = tuple(sorted(labels.items()))
        series[key] = series.get(key, 0) + n
        if help_:
            self._help.setdefault(name, help_)

    def value(self, name: str, **labels: str) -> float:
        """Sum over the series matching ``labels`` (tests read this)."""
        total = 0.0
        for key, v in self._counters.get(name, {}).items():
            if all(item in key for item in labels.items()):
                total += v
        return total

    def render(self, extra: list[tuple[str, str, str, dict[str, str], float]]) -> str:
        lines: list[str] = []
        for name in sorted(self._counters):
            lines.append(f"# HELP {name} {self._help.get(name, name)}")
            lines.append(f"# TYPE {name} counter")
            for key, v in sorted(self._counters[name].items()):
                lines.append(f"{name}{_labels(dict(key))} {v:g}")
        seen: set[str] = set()
        for name, kind, help_, labels, v in extra:
            if name not in seen:
                seen.add(name)
                lines.append(f"# HELP {name} {help_}")
                lines.append(f"# TYPE {name} {kind}")
            lines.append(f"{name}{_labels(labels)} {v:g}")
        return "\n".join(lines) + "\n"


def _labels(labels: Mapping[str, str]) -> str:
    if not labels:
        return ""
    esc = {
        k: str(v).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
        for k, v in labels.items()
    }
    return "{" + ",".join(f'{k}="{v}"' for k, v in sorted(esc.items())) + "}"


def error_body(message: str, type_: str, code: str | None = None) -> dict[str, Any]:
    """OpenAI's error shape."""
    return {"error": {"message": message, "type": type_, "code": code}}


class GuardTrip(Exception):
    """A guard cut the stream: ``reason`` like ``json_invalid_char`` or ``loop``."""

    def __init__(self, reason: str, detail: str = "", position: int | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.detail = detail
        self.position = position


@dataclass(slots=True)
class JsonSpec:
    """What a request asked for: JSON at all, its schema, its required keys."""

    schema: dict[str, Any] | None = None
    expected_keys: list[str] | None = None
    require_object: bool = False

    def info(self) -> RequestInfo:
        return RequestInfo(
            expects_json=True, json_schema=self.schema, expected_keys=self.expected_keys
        )


def json_spec(body: Mapping[str, Any], expected_keys: Any) -> JsonSpec | None:
    """The request's JSON contract, or None when it asked for free text."""
    keys = (
        [k for k in expected_keys if isinstance(k, str)]
        if isinstance(expected_keys, list)
        else None
    )
    fmt = body.get("response_format")
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    schema = None
    if kind == "json_schema":
        wrapper = fmt.get("json_schema") if isinstance(fmt, dict) else None
        if isinstance(wrapper, dict):
            inner = wrapper.get("schema")
            schema = inner if isinstance(inner, dict) else None
    if kind not in ("json_object", "json_schema") and not keys:
        return None
    return JsonSpec(schema=schema, expected_keys=keys or None, require_object=kind == "json_object")


@dataclass(slots=True)
class Plan:
    """Everything decided about one request before the first upstream call."""

    request_id: str
    route: str
    preference: str
    decision: Decision
    body: dict[str, Any]  # what goes upstream (extensions removed, logprobs maybe added)
    user_logprobs: bool
    spec: JsonSpec | None
    shadow: bool
    noise: bool
    fallbacks: list[str] = field(default_factory=list)
    timeouts: int = 0
    upstream_errors: int = 0


# -- the gateway -----------------------------------------------------------------


class Gateway:
    """State shared by every request: pools, controller, publishers, metrics."""

    def __init__(
        self,
        config: GatewayConfig,
        *,
        publisher: ShadowPublisher | None = None,
        degradations: DegradationPublisher | None = None,
        controller: RouteController | None = None,
        upstreams: Upstreams | None = None,
    ) -> None:
        self.config = config
        self.publisher = publisher
        self.degradations = degradations
        self.controller = controller
        self.upstreams = upstreams or Upstreams(config)
        self.metrics = Metrics()
        self._shadow_tasks: set[asyncio.Task[None]] = set()
        self._shadow_slots = asyncio.Semaphore(config.shadow_concurrency)
        self.started_at = time.time()

    async def start(self) -> None:
        if self.publisher is not None:
            await self.publisher.start()
        if self.degradations is not None:
            await self.degradations.start()
        if self.controller is not None:
            for route in self.config.routes:
                self.controller.watch(route)
            await self.controller.start()

    async def stop(self, timeout: float = 5.0) -> None:
        tasks = list(self._shadow_tasks)
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=timeout)
            for task in pending:
                task.cancel()
            for task in pending:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if self.controller is not None:
            await self.controller.stop()
        if self.publisher is not None:
            await self.publisher.stop(timeout)
        if self.degradations is not None:
            await self.degradations.stop(timeout)
        await self.upstreams.aclose()

    async def wait_shadows(self, timeout: float) -> None:
        """Wait for the background shadow tasks started so far (tests, shutdown)."""
        tasks = list(self._shadow_tasks)
        if tasks:
            await asyncio.wait(tasks, timeout=timeout)

    # -- planning --------------------------------------------------------------

    def route_state(self, route: str) -> RouteState | None:
        applied = self.controller.state(route) if self.controller is not None else None
        if applied is None:
            return None
        return RouteState(applied.action, applied.target_precision, applied.percent)

    def plan(self, request: Request, body: dict[str, Any]) -> Plan | JSONResponse:
        cfg = self.config
        request_id = request.headers.get("x-request-id") or f"req-{uuid.uuid4().hex}"
        route = request.headers.get(ROUTE_HEADER) or body.get("route")
        if route is None and isinstance(body.get("model"), str) and body["model"] in cfg.routes:
            route = body["model"]
        route = route or cfg.route_default
        if route not in cfg.routes:
            return _bad_request(f"unknown route {route!r}", "route")
        preference = (
            body.get("precision_preference")
            or request.headers.get(PREFERENCE_HEADER)
            or cfg.default_preference
        )
        if preference not in PREFERENCES:
            return _bad_request(
                f"precision_preference must be one of {', '.join(PREFERENCES)}",
                "precision_preference",
            )
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return _bad_request("messages must be a non-empty list", "messages")
        spec = json_spec(body, body.get("expected_keys"))
        upstream = {k: v for k, v in body.items() if k not in _EXTENSIONS}
        route_cfg = cfg.routes[route]
        decision = decide(
            order=cfg.order,
            candidate=route_cfg.candidate,
            reference=route_cfg.reference,
            preference=preference,  # type: ignore[arg-type]
            state=self.route_state(route),
            request_id=request_id,
        )
        key = cfg.sample_salt + request_id
        shadow = decision.pair_candidate is not None and sampled(key, cfg.shadow_rate(route))
        noise = sampled(NOISE_SALT + key, cfg.noise_rate(route))
        user_logprobs = bool(body.get("logprobs"))
        if shadow or noise or cfg.logprobs_on_user_calls:
            upstream["logprobs"] = True
            upstream["top_logprobs"] = max(int(body.get("top_logprobs") or 0), cfg.top_logprobs)
        upstream.pop("stream_options", None)
        return Plan(
            request_id=request_id,
            route=route,
            preference=preference,
            decision=decision,
            body=upstream,
            user_logprobs=user_logprobs,
            spec=spec,
            shadow=shadow,
            noise=noise,
        )

    # -- serving -----------------------------------------------------------------

    async def chat(self, request: Request) -> Response:
        try:
            body = await request.json()
        except ValueError:
            return _bad_request("the body is not JSON", None)
        if not isinstance(body, dict):
            return _bad_request("the body must be a JSON object", None)
        plan = self.plan(request, body)
        if isinstance(plan, JSONResponse):
            self.metrics.inc(
                "quantdrift_gateway_requests_total",
                "user requests",
                route="-",
                precision="-",
                outcome="bad_request",
            )
            return plan
        stream = bool(body.get("stream"))
        try:
            if stream and plan.spec is None:
                return await self._serve_stream(plan)
            completion, text = await self._serve_buffered(plan)
        except UpstreamClientError as exc:
            self._count(plan, "-", "client_error")
            content = (
                exc.body
                if isinstance(exc.body, dict)
                else error_body(str(exc.body or exc), "invalid_request_error", "upstream_rejected")
            )
            return JSONResponse(content, status_code=exc.status, headers=self._headers(plan))
        except UpstreamError as exc:
            return self._all_failed(plan, exc)
        self._count(plan, completion.precision, "ok")
        self._spawn_shadow(plan, completion)
        headers = self._headers(plan, completion.precision)
        if stream:
            return StreamingResponse(
                self._replay(plan, completion, text),
                media_type="text/event-stream",
                headers=headers,
            )
        return JSONResponse(self._completion_body(plan, completion, text), headers=headers)

    def _count(self, plan: Plan, precision: str, outcome: str) -> None:
        self.metrics.inc(
            "quantdrift_gateway_requests_total",
            "user requests",
            route=plan.route,
            precision=precision,
            outcome=outcome,
        )

    def _headers(self, plan: Plan, precision: str | None = None) -> dict[str, str]:
        headers = {"x-request-id": plan.request_id, "x-quantdrift-route": plan.route}
        if precision:
            headers["x-quantdrift-precision"] = precision
        if plan.fallbacks:
            headers["x-quantdrift-fallbacks"] = ",".join(plan.fallbacks)
        return headers

    def _all_failed(self, plan: Plan, exc: UpstreamError) -> JSONResponse:
        self._count(plan, "-", "upstream_error")
        timeout = plan.upstream_errors > 0 and plan.timeouts == plan.upstream_errors
        status, code = (504, "upstream_timeout") if timeout else (502, "upstream_unavailable")
        chain = " -> ".join(plan.decision.chain)
        return JSONResponse(
            error_body(f"every upstream failed ({chain}): {exc}", "upstream_error", code),
            status_code=status,
            headers=self._headers(plan),
        )

    def _fallback(self, plan: Plan, precision: str, reason: str, trip: GuardTrip | None) -> None:
        """Record one fallback: metrics always, a DegradationEvent for quality failures."""
        plan.fallbacks.append(f"{precision}:{reason}")
        self.metrics.inc(
            "quantdrift_gateway_fallbacks_total",
            "fallbacks to the next precision",
            route=plan.route,
            precision=precision,
            reason=reason,
        )
        if trip is not None:
            chain = plan.decision.chain
            at = chain.index(precision) if precision in chain else -1
            nxt = chain[at + 1] if 0 <= at < len(chain) - 1 else None
            self._degradation(plan, precision, nxt, trip, after_flush=False)

    def _degradation(
        self, plan: Plan, precision: str, nxt: str | None, trip: GuardTrip, after_flush: bool
    ) -> None:
        if self.degradations is None:
            return
        try:
            event = DegradationEvent(
                event_id=uuid.uuid4().hex,
                route=plan.route,
                precision=precision,
                fallback_precision=nxt,
                reason=trip.reason,
                ts=time.time(),
                request_id=plan.request_id[:128],
                detail={
                    "detail": trip.detail[:300],
                    "position": trip.position,
                    "after_flush": after_flush,
                    "expects_json": plan.spec is not None,
                },
            )
            self.degradations.send(event)
        except Exception:  # never fail the user's request over a telemetry event
            log.exception("degradation event not recorded")

    def _guards(self, plan: Plan) -> tuple[JsonGuard | None, DegenerationProbe]:
        spec = plan.spec
        guard = None
        if spec is not None:
            jg = self.config.json_guard
            guard = guard_for(
                expected_keys=spec.expected_keys,
                json_schema=spec.schema,
                max_whitespace_run=jg.max_whitespace_run,
                max_depth=jg.max_depth,
            )
            guard.require_object = guard.require_object or spec.require_object
        return guard, DegenerationProbe(self.config.degeneration)

    def _check(
        self,
        delta: str,
        tops: list[dict[str, float]],
        guard: JsonGuard | None,
        probe: DegenerationProbe,
    ) -> None:
        """Feed one chunk to the guards; GuardTrip when one fails."""
        if guard is not None and delta:
            result = guard.feed(delta)
            if not result.ok:
                raise GuardTrip(f"json_{result.reason}", result.detail, result.position)
        if probe.update(delta, tops):
            raise GuardTrip(str(probe.reason), probe.detail)

    def _close_guards(
        self,
        acc: Accumulator,
        guard: JsonGuard | None,
        probe: DegenerationProbe,
        spec: JsonSpec | None,
    ) -> str:
        """End-of-stream checks; the text to give the user (the bare JSON value if guarded)."""
        text = acc.text
        if probe.finish():
            raise GuardTrip(str(probe.reason), probe.detail)
        if guard is None or spec is None:
            return text
        result = guard.close()
        if not result.ok:
            raise GuardTrip(f"json_{result.reason}", result.detail, result.position)
        span = guard.span
        value = text[span[0] : span[1]] if span else text
        if spec.schema is not None:
            ok, error = check_json_contract(value, spec.info())
            if ok is False:
                raise GuardTrip("json_schema", error or "")
        return value

    async def _serve_buffered(self, plan: Plan) -> tuple[Completion, str]:
        """Answer from the first precision of the chain whose answer passes the guards."""
        chain = plan.decision.chain
        last: UpstreamError | None = None
        for i, precision in enumerate(chain):
            enforce = i < len(chain) - 1
            guard, probe = self._guards(plan)
            acc = Accumulator(precision)
            try:
                stream = self.upstreams[precision].stream(plan.body)
                async with contextlib.aclosing(stream):
                    async for chunk in stream:
                        delta, tops = acc.add(chunk)
                        if enforce:
                            self._check(delta, tops, guard, probe)
                if not enforce:
                    return acc.finish(), self._final_text(plan, acc, guard, probe)
                text = self._close_guards(acc, guard, probe, plan.spec)
                return acc.finish(), text
            except GuardTrip as trip:
                self._fallback(plan, precision, trip.reason, trip)
            except UpstreamError as exc:
                last = exc
                self._upstream_failed(plan, precision, exc)
        assert last is not None  # the last precision never trips a guard
        raise last

    def _final_text(
        self, plan: Plan, acc: Accumulator, guard: JsonGuard | None, probe: DegenerationProbe
    ) -> str:
        """The last precision's answer, unguarded; its failures are counted, not acted on."""
        try:
            for delta in (acc.text,):
                if guard is not None and delta:
                    guard.feed(delta)
            return self._close_guards(acc, guard, probe, plan.spec)
        except GuardTrip as trip:
            self.metrics.inc(
                "quantdrift_gateway_final_guard_failures_total",
                "answers of the last precision that failed a guard (returned as they are)",
                route=plan.route,
                precision=acc.completion.precision,
                reason=trip.reason,
            )
            plan.fallbacks.append(f"{acc.completion.precision}:{trip.reason}:served")
            return acc.text

    def _upstream_failed(self, plan: Plan, precision: str, exc: UpstreamError) -> None:
        plan.upstream_errors += 1
        if isinstance(exc, UpstreamTimeout):
            plan.timeouts += 1
        reason = f"upstream_{error_reason(exc)}"
        log.warning("route %s: %s failed (%s): %s", plan.route, precision, reason, exc)
        self._fallback(plan, precision, reason, None)

    async def _serve_stream(self, plan: Plan) -> Response:
        """Free-text streaming: hold back the first tokens, then forward as they come."""
        chain = plan.decision.chain
        holdback = self.config.stream_holdback_tokens
        last: UpstreamError | None = None
        for i, precision in enumerate(chain):
            enforce = i < len(chain) - 1
            _, probe = self._guards(plan)
            acc = Accumulator(precision)
            stream = self.upstreams[precision].stream(plan.body)
            held: list[dict[str, Any]] = []
            done = False
            try:
                while acc.content_chunks < holdback or (holdback == 0 and not held):
                    try:
                        chunk = await anext(stream)
                    except StopAsyncIteration:
                        done = True
                        break
                    delta, tops = acc.add(chunk)
                    held.append(chunk)
                    if enforce:
                        self._check(delta, tops, None, probe)
                if done and enforce and probe.finish():
                    raise GuardTrip(str(probe.reason), probe.detail)
            except GuardTrip as trip:
                await stream.aclose()
                self._fallback(plan, precision, trip.reason, trip)
                continue
            except UpstreamError as exc:
                await stream.aclose()
                last = exc
                self._upstream_failed(plan, precision, exc)
                continue
            except UpstreamClientError:
                await stream.aclose()
                raise
            except BaseException:
                await stream.aclose()
                raise
            self._count(plan, precision, "ok")
            return StreamingResponse(
                self._forward(plan, precision, acc, probe, held, stream, done, enforce),
                media_type="text/event-stream",
                headers=self._headers(plan, precision),
            )
        assert last is not None
        raise last

    async def _forward(
        self,
        plan: Plan,
        precision: str,
        acc: Accumulator,
        probe: DegenerationProbe,
        held: list[dict[str, Any]],
        stream: AsyncGenerator[dict[str, Any], None],
        done: bool,
        enforce: bool,
    ) -> AsyncIterator[bytes]:
        completed = False
        try:
            for chunk in held:
                yield self._sse(plan, chunk)
            if not done:
                async for chunk in stream:
                    delta, tops = acc.add(chunk)
                    if enforce and probe.update(delta, tops):
                        # The user has seen the start: stop the loop here, say so, record it.
                        self.metrics.inc(
                            "quantdrift_gateway_stream_cuts_total",
                            "streams stopped by the degeneration guard after forwarding began",
                            route=plan.route,
                            precision=precision,
                            reason=str(probe.reason),
                        )
                        self._degradation(
                            plan, precision, None, GuardTrip(str(probe.reason), probe.detail), True
                        )
                        last = _stop_chunk(chunk, "length")
                        yield self._sse(plan, last)
                        break
                    yield self._sse(plan, chunk)
            completed = True
        except UpstreamError as exc:
            self.metrics.inc(
                "quantdrift_gateway_stream_errors_total",
                "upstream failures after forwarding began",
                route=plan.route,
                precision=precision,
                reason=error_reason(exc),
            )
            yield _sse_data(error_body(str(exc), "upstream_error", "upstream_disconnected"))
        finally:
            await stream.aclose()
        yield b"data: [DONE]\n\n"
        if completed:
            self._spawn_shadow(plan, acc.finish())

    def _sse(self, plan: Plan, chunk: dict[str, Any]) -> bytes:
        if not plan.user_logprobs:
            choices = chunk.get("choices")
            if isinstance(choices, list):
                chunk = {
                    **chunk,
                    "choices": [
                        {**c, "logprobs": None} if isinstance(c, dict) else c for c in choices
                    ],
                }
        return _sse_data(chunk)

    async def _replay(self, plan: Plan, completion: Completion, text: str) -> AsyncIterator[bytes]:
        """A buffered (JSON) answer as one clean stream: role, content, finish, [DONE]."""
        base = {
            "id": completion.id or f"chatcmpl-{plan.request_id}",
            "object": "chat.completion.chunk",
            "created": completion.created or int(time.time()),
            "model": completion.model,
        }

        def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            return _sse_data({**base, "choices": [choice]})

        yield chunk({"role": "assistant", "content": ""})
        if text:
            yield chunk({"content": text})
        yield chunk({}, completion.finish_reason or "stop")
        yield b"data: [DONE]\n\n"

    def _completion_body(self, plan: Plan, completion: Completion, text: str) -> dict[str, Any]:
        logprobs = None
        if plan.user_logprobs and text == completion.text:
            k = int(plan.body.get("top_logprobs") or 0)
            logprobs = {
                "content": [
                    {**e, "top_logprobs": (e.get("top_logprobs") or [])[:k]}
                    for e in completion.logprobs_content
                ]
            }
        body: dict[str, Any] = {
            "id": completion.id or f"chatcmpl-{plan.request_id}",
            "object": "chat.completion",
            "created": completion.created or int(time.time()),
            "model": completion.model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "logprobs": logprobs,
                    "finish_reason": completion.finish_reason or "stop",
                }
            ],
        }
        if completion.usage:
            body["usage"] = completion.usage
        return body

    # -- shadow ------------------------------------------------------------------

    def _spawn_shadow(self, plan: Plan, user: Completion) -> None:
        """Start the shadow / noise work for this request in the background; never raises."""
        if not (plan.shadow or plan.noise):
            return
        try:
            for kind, wanted in (("shadow", plan.shadow), ("noise", plan.noise)):
                if wanted:
                    self.metrics.inc(
                        "quantdrift_gateway_shadow_sampled_total",
                        "requests sampled for pairs",
                        route=plan.route,
                        kind=kind,
                    )
            if len(self._shadow_tasks) >= self.config.shadow_queue:
                self.metrics.inc(
                    "quantdrift_gateway_shadow_skipped_total",
                    "sampled requests not mirrored because the gateway was busy",
                    route=plan.route,
                    reason="busy",
                )
                return
            task = asyncio.get_running_loop().create_task(self._shadow(plan, user))
            self._shadow_tasks.add(task)
            task.add_done_callback(self._shadow_tasks.discard)
        except Exception:  # the user's request must not fail because of the mirror
            log.exception("shadow task not started")

    async def _shadow(self, plan: Plan, user: Completion) -> None:
        cache: dict[str, Completion] = {user.precision: user}
        async with self._shadow_slots:
            if plan.shadow:
                await self._guarded(plan, "shadow", self._shadow_pair(plan, cache))
            if plan.noise:
                await self._guarded(plan, "noise", self._noise_pair(plan, cache))

    async def _guarded(self, plan: Plan, kind: str, work: Any) -> None:
        try:
            pair = await work
        except UpstreamError as exc:
            self._shadow_error(plan, kind, f"upstream_{error_reason(exc)}")
            return
        except UpstreamClientError:
            self._shadow_error(plan, kind, "upstream_rejected")
            return
        except Exception as exc:  # a bug in pair building must stay off the user's path
            log.exception("shadow %s failed", kind)
            self._shadow_error(plan, kind, type(exc).__name__)
            return
        if pair is None:
            return
        if self.publisher is None:
            self._shadow_error(plan, kind, "no_publisher")
            return
        self.publisher.offer(pair)

    def _shadow_error(self, plan: Plan, kind: str, reason: str) -> None:
        self.metrics.inc(
            "quantdrift_gateway_shadow_errors_total",
            "shadow calls or pairs that failed",
            route=plan.route,
            kind=kind,
            reason=reason,
        )

    async def _collect(self, precision: str, body: Mapping[str, Any]) -> Completion:
        acc = Accumulator(precision)
        stream = self.upstreams[precision].stream(body, total_s=self.config.timeouts.shadow_total_s)
        async with contextlib.aclosing(stream):
            async for chunk in stream:
                acc.add(chunk)
        return acc.finish()

    async def _shadow_pair(self, plan: Plan, cache: dict[str, Completion]) -> PairEvent | None:
        d = plan.decision
        if d.pair_candidate is None:
            return None
        body = {**plan.body, "logprobs": True, "top_logprobs": self.config.top_logprobs}
        for precision in (d.pair_candidate, d.pair_reference):
            if precision not in cache:
                cache[precision] = await self._collect(precision, body)
        cand, ref = cache[d.pair_candidate], cache[d.pair_reference]
        tf = None
        if self.config.routes[plan.route].teacher_forced and cand.text:
            tf = await self.upstreams[d.pair_reference].score(
                plan.body.get("messages"), cand.text, timeout_s=self.config.timeouts.shadow_total_s
            )
            if tf is None:
                self._shadow_error(plan, "shadow", "teacher_forced")
        return self._pair(plan, "shadow", cand, ref, tf, self.config.shadow_rate(plan.route))

    async def _noise_pair(self, plan: Plan, cache: dict[str, Completion]) -> PairEvent:
        ref = plan.decision.pair_reference
        body = {**plan.body, "logprobs": True, "top_logprobs": self.config.top_logprobs}
        if ref not in cache:
            cache[ref] = await self._collect(ref, body)
        second_body = dict(body)
        if _greedy(body):
            second_body["temperature"] = NOISE_TEMPERATURE
        second = await self._collect(ref, second_body)
        return self._pair(
            plan, "noise", cache[ref], second, None, self.config.noise_rate(plan.route)
        )

    def _pair(
        self,
        plan: Plan,
        kind: str,
        cand: Completion,
        ref: Completion,
        tf: list[float] | None,
        rate: float,
    ) -> PairEvent:
        body = plan.body
        spec = plan.spec
        request = RequestInfo.model_validate(
            {
                "prompt": _prompt_text(body.get("messages")),
                "precision_preference": plan.preference,
                "expects_json": spec is not None,
                "json_schema": spec.schema if spec else None,
                "expected_keys": spec.expected_keys if spec else None,
                "temperature": _num(body.get("temperature"), lambda v: v >= 0),
                "top_p": _num(body.get("top_p"), lambda v: 0 < v <= 1),
                "max_tokens": _int(body.get("max_completion_tokens") or body.get("max_tokens")),
            }
        )
        rid = plan.request_id
        if len(rid) > 100:
            rid = hashlib.sha256(rid.encode()).hexdigest()[:32]
        return PairEvent(
            pair_id=f"{rid}:{kind}",
            ts=time.time(),
            route=plan.route,
            kind=kind,  # type: ignore[arg-type]
            candidate=cand.output(),
            reference=ref.output(),
            request=request,
            reference_logprobs_on_candidate=tf,
            sample_rate=max(rate, 1e-9),
        )

    # -- observability -------------------------------------------------------------

    def health(self) -> dict[str, Any]:
        cfg = self.config
        routes = {}
        for route, rc in cfg.routes.items():
            d = decide(
                order=cfg.order,
                candidate=rc.candidate,
                reference=rc.reference,
                preference="cost_optimized",
                state=self.route_state(route),
                request_id="health",
            )
            routes[route] = {
                "serving": d.serve,
                "mode": d.mode,
                "epoch": self.controller.epoch(route) if self.controller else 0,
            }
        return {
            "status": "ok",
            "routes": routes,
            "precisions": {p: len(u) for p, u in cfg.precisions.items()},
            "kafka_connected": bool(self.publisher and self.publisher.connected),
            "control_ready": bool(self.controller and self.controller.kafka_ready),
            "shadow_in_flight": len(self._shadow_tasks),
        }

    def render_metrics(self) -> str:
        extra: list[tuple[str, str, str, dict[str, str], float]] = []
        if self.publisher is not None:
            s = self.publisher.stats
            extra.append(
                (
                    "quantdrift_gateway_shadow_offered_total",
                    "counter",
                    "pairs offered to the publisher",
                    {},
                    s.offered,
                )
            )
            extra.append(
                (
                    "quantdrift_gateway_shadow_sent_total",
                    "counter",
                    "pairs acknowledged by Kafka",
                    {},
                    s.sent,
                )
            )
            extra.append(
                (
                    "quantdrift_gateway_shadow_dropped_total",
                    "counter",
                    "pairs dropped, by reason",
                    {"reason": "any"},
                    s.dropped_total,
                )
            )
            for reason, n in sorted(s.dropped.items()):
                extra.append(
                    (
                        "quantdrift_gateway_shadow_dropped_total",
                        "counter",
                        "",
                        {"reason": reason},
                        n,
                    )
                )
            extra.append(
                (
                    "quantdrift_gateway_shadow_queue_depth",
                    "gauge",
                    "pairs waiting for Kafka",
                    {},
                    self.publisher.queue_depth,
                )
            )
        if self.degradations is not None:
            s = self.degradations.stats
            extra.append(
                (
                    "quantdrift_gateway_degradation_events_total",
                    "counter",
                    "degradation events, by outcome",
                    {"outcome": "sent"},
                    s.sent,
                )
            )
            extra.append(
                (
                    "quantdrift_gateway_degradation_events_total",
                    "counter",
                    "",
                    {"outcome": "dropped"},
                    s.dropped_total,
                )
            )
        if self.controller is not None:
            for route in self.config.routes:
                extra.append(
                    (
                        "quantdrift_gateway_route_epoch",
                        "gauge",
                        "epoch of the route's applied command",
                        {"route": route},
                        self.controller.epoch(route),
                    )
                )
            for reason, n in sorted(self.controller.verifier.refused.items()):
                extra.append(
                    (
                        "quantdrift_gateway_commands_refused_total",
                        "counter",
                        "control commands refused, by reason",
                        {"reason": reason},
                        n,
                    )
                )
        extra.append(
            (
                "quantdrift_gateway_shadow_in_flight",
                "gauge",
                "background shadow tasks",
                {},
                len(self._shadow_tasks),
            )
        )
        return self.metrics.render(extra)


# -- helpers -----------------------------------------------------------------------


def _sse_data(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"


def _stop_chunk(chunk: Mapping[str, Any], finish: str) -> dict[str, Any]:
    return {
        **chunk,
        "choices": [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": finish}],
    }


def _bad_request(message: str, param: str | None) -> JSONResponse:
    body = error_body(message, "invalid_request_error", "invalid_value")
    body["error"]["param"] = param
    return JSONResponse(body, status_code=400)


def _greedy(body: Mapping[str, Any]) -> bool:
    t = body.get("temperature")
    return isinstance(t, int | float) and t == 0


def _num(value: Any, ok: Any) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool) and ok(value):
        return float(value)
    return None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 1 else None


def _prompt_text(messages: Any) -> str | None:
    """The chat as text for the pair: ``role: content`` lines (multimodal parts: their text)."""
    if not isinstance(messages, list):
        return None
    lines = []
    for m in messages:
        if not isinstance(m, dict):
            continue
        content = m.get("content")
        if isinstance(content, list):
            content = " ".join(
                str(p.get("text", "")) for p in content if isinstance(p, dict) and "text" in p
            )
        lines.append(f"{m.get('role', 'user')}: {content or ''}")
    return "\n".join(lines)[:200_000]


# -- the app -----------------------------------------------------------------------


def create_app(gateway: Gateway) -> FastAPI:
    """The ASGI app; its lifespan starts and stops the gateway's components."""

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await gateway.start()
        try:
            yield
        finally:
            await gateway.stop()

    app = FastAPI(title="quantdrift gateway", lifespan=lifespan)
    app.state.gateway = gateway

    @app.post("/v1/chat/completions", response_model=None)
    async def chat(request: Request) -> Response:
        return await gateway.chat(request)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return gateway.health()

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse(
            gateway.render_metrics(), media_type="text/plain; version=0.0.4; charset=utf-8"
        )

    return app
