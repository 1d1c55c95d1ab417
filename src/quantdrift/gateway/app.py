"""The gateway's HTTP surface: ``Gateway`` (shared state) and ``create_app`` (FastAPI).

Endpoints: ``POST /v1/chat/completions`` (streaming and not), ``GET /v1/models``
(the routes the caller's key may use, as models), ``GET /health`` and
``GET /metrics`` (on the API port, or only on ``admin_listen`` when set; behind
``auth.admin_token_sha256`` when set).

One request, in order: authenticate (``auth.py``, 401), parse, plan
(``planning.py``, pure: 4xx refusals), run the chain (``executor.py``), answer
(``openai_wire.py``), and hand a sampled request to the shadow runner
(``shadow.py``) after the user's answer is complete. Telemetry
(``telemetry.py``) counts each step. Every error a client sees has OpenAI's
shape and never an upstream's URL or host name.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import re
import secrets
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Iterable, Iterator, Mapping
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from quantdrift.errors import UpstreamError
from quantdrift.gateway.attempts import ChainDeadline, Chunks, Degradations, Trace
from quantdrift.gateway.auth import Authenticator, Principal
from quantdrift.gateway.capacity import RetryBudget
from quantdrift.gateway.completions import PATH as COMPLETIONS_PATH
from quantdrift.gateway.completions import (
    CompletionPlan,
    drain,
    fold,
    open_chain,
    plan_completion,
)
from quantdrift.gateway.control.controller import RouteController
from quantdrift.gateway.control.preflight_gate import PreflightGate
from quantdrift.gateway.executor import FallbackExecutor, StreamStart
from quantdrift.gateway.gateway_config import GatewayConfig
from quantdrift.gateway.openai_wire import (
    DONE,
    STOPPED_MID_STREAM,
    Completion,
    completion_body,
    error_body,
    replay_chunks,
    scrub,
    sse,
)
from quantdrift.gateway.planning import Incoming, Plan, Refusal, plan_request
from quantdrift.gateway.publisher import DegradationPublisher, ShadowPublisher
from quantdrift.gateway.routing import RouteDirective, decide
from quantdrift.gateway.shadow import TOO_LARGE, ShadowRunner
from quantdrift.gateway.telemetry import CONTENT_TYPE, Telemetry, counter, gauge
from quantdrift.gateway.upstreams import UpstreamClientError, Upstreams
from quantdrift.integrations import otel
from quantdrift.schemas.privacy import salt_problem
from quantdrift.supervision import Supervisor

log = logging.getLogger(__name__)
T = TypeVar("T")
# On shutdown, after the shadow drain: what Kafka gets to take the queued pairs.
# With uvicorn's 2 s and the default 4 s drain, a stop stays under Docker's 10 s.
PUBLISH_DRAIN_S = 2.0


class ClientGone(Exception):
    """The client disconnected before its answer was ready."""


def error_response(
    status: int,
    message: str,
    type_: str,
    code: str | None = None,
    param: str | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    return JSONResponse(error_body(message, type_, code, param), status, headers=headers)


class Gateway:
    """State shared by every request: pools, controller, publishers, runner, metrics."""

    def __init__(
        self,
        config: GatewayConfig,
        *,
        publisher: ShadowPublisher | None = None,
        degradations: DegradationPublisher | None = None,
        controller: RouteController | None = None,
        upstreams: Upstreams | None = None,
        shadow_upstreams: Upstreams | None = None,
        preflight_keys: Mapping[str, bytes] | None = None,
    ) -> None:
        self.config = config
        self.publisher = publisher
        self.degradations = degradations
        self.controller = controller
        self.upstreams = upstreams or Upstreams(config)
        self.auth = Authenticator(config.auth)
        self.metrics = Telemetry()
        # A secret salt: a caller cannot compute which of its requests get mirrored.
        self.sample_salt = config.sample_salt or secrets.token_hex(16)
        prompt_salt = config.prompt_salt or self.sample_salt
        if isinstance(publisher, ShadowPublisher) and not publisher.prompt_salt:
            publisher.prompt_salt = prompt_salt  # one salt for every prompt hash
        self.prompt_salt_problem = salt_problem(prompt_salt)
        self.budget = RetryBudget(
            config.retry_budget.ratio,
            config.retry_budget.min_per_window,
            config.retry_budget.window_s,
        )
        self.executor = FallbackExecutor(
            config,
            self.upstreams,
            self.metrics,
            Degradations(degradations.offer if degradations is not None else None),
            self.budget,
        )
        self.shadow = ShadowRunner(
            config,
            shadow_upstreams or Upstreams(config, shadow=True),
            publisher.offer if publisher is not None else None,
            self.route_state,
            prompt_salt=prompt_salt,
        )
        # Routes with a ``preflight:`` gate verify their report with the signing key ring.
        self.preflight = PreflightGate(config, dict(preflight_keys or {}))
        # One supervisor for every long-lived task: crashes counted in /metrics, and a
        # task given up on makes /health answer 503.
        self.supervisor = Supervisor()
        for part in (self.shadow, self.preflight, publisher, degradations, controller):
            if part is not None:
                part.supervisor = self.supervisor
        self.metrics.live(self._live_metrics)
        self.started_at = time.time()
        self._hosts = self.upstreams.hosts

    # -- lifecycle -------------------------------------------------------------------

    async def start(self) -> None:
        if not self.auth.enabled:
            log.warning(
                "gateway: no auth keys configured, every caller may use every route and "
                "high_precision (add an auth: section to the config)"
            )
        if not self.config.sample_salt:
            log.warning(
                "gateway: no sample_salt, a random one per process (sampling differs "
                "across replicas)"
            )
        if self.prompt_salt_problem is not None:
            log.error(
                "gateway: the prompt salt %s: prompt hashes in pairs can be reversed by "
                "anyone who guesses prompts. Set prompt_salt (or sample_salt) to a secret.",
                self.prompt_salt_problem,
            )
        await self.preflight.start()
        await self.shadow.start()
        if self.publisher is not None:
            await self.publisher.start()
        if self.degradations is not None:
            await self.degradations.start()
        if self.controller is not None:
            for route in self.config.routes:
                self.controller.watch(route)
            await self.controller.start()

    async def stop(self, timeout: float | None = None) -> None:
        """Stop everything; shadow jobs get ``shadow_drain_s`` (or ``timeout``) to finish."""
        timeout = self.config.shadow_drain_s if timeout is None else timeout
        await self.preflight.stop()
        await self.shadow.stop(timeout)
        if self.controller is not None:
            await self.controller.stop()
        if self.publisher is not None:
            await self.publisher.stop(PUBLISH_DRAIN_S)
        if self.degradations is not None:
            await self.degradations.stop(PUBLISH_DRAIN_S)
        await self.upstreams.aclose()

    async def wait_shadows(self, timeout: float) -> None:
        """Wait until the shadow queue is empty and idle (tests, benchmarks)."""
        await self.shadow.wait_idle(timeout)

    def route_state(self, route: str) -> RouteDirective | None:
        """The route's directive (``routing.RouteDirective``) as the controller knows it.

        Fail closed: until the controller has read the route keys or replayed the
        control topic once (``backstop_known``), a route may be locked in rollback
        without this process knowing, so every route serves its reference (no
        candidate call, not even in shadow) -- rather than report not-ready, since the
        reference can still answer users.
        """
        if self.controller is None:
            return None
        if not self.controller.backstop_known:
            return RouteDirective("rollback", self.config.routes[route].reference)
        applied = self.controller.state(route)
        if applied is None:
            return None
        return RouteDirective(applied.action, applied.target_precision, applied.percent)

    # -- serving -----------------------------------------------------------------------

    def _refuse_auth(self) -> JSONResponse:
        self.metrics.auth_refusals.labels("invalid_api_key").inc()
        return error_response(
            401,
            "Incorrect API key provided. Send it as 'Authorization: Bearer <key>'.",
            "invalid_request_error",
            "invalid_api_key",
        )

    def principal(self, request: Request) -> Principal | None:
        return self.auth.principal(request.headers.get("authorization"))

    async def _asked(
        self, request: Request, id_prefix: str
    ) -> tuple[dict[str, Any], Incoming] | Response:
        """The JSON body and what planning reads besides it, or the 401/4xx refusing them."""
        principal = self.principal(request)
        if principal is None:
            return self._refuse_auth()
        body = await json_object(request, self.config.limits.max_body_bytes)
        if isinstance(body, Response):
            return body
        incoming = Incoming(
            {k.lower(): v for k, v in request.headers.items()},
            principal,
            f"{id_prefix}-{uuid.uuid4().hex}",
            self.route_state,
            self.preflight.cap,
        )
        return body, incoming

    async def chat(self, request: Request) -> Response:
        t0 = time.monotonic()
        asked = await self._asked(request, "req")
        if isinstance(asked, Response):
            return asked
        plan = plan_request(self.config, *asked, sample_salt=self.sample_salt)
        if isinstance(plan, Refusal):
            outcome = "forbidden" if plan.status == 403 else "bad_request"
            if plan.status == 403:
                self.metrics.auth_refusals.labels(plan.code).inc()
            self.metrics.requests.labels("-", "-", outcome).inc()
            return error_response(plan.status, plan.message, plan.type, plan.code, plan.param)
        if (plan.shadow or plan.noise) and (
            getattr(request.state, "body_bytes", 0) > self.config.limits.max_shadow_body_bytes
        ):
            # A queued shadow job holds the request to re-ask the reference: past this size
            # it is not mirrored (counted), so the queue's memory stays within
            # shadow_queue x max_shadow_body_bytes.
            self.shadow.dropped[TOO_LARGE] = self.shadow.dropped.get(TOO_LARGE, 0) + 1
            plan = dataclasses.replace(plan, shadow=False, noise=False)
        self.budget.record_request(time.monotonic())
        trace = Trace(t0, t0 + self.config.timeouts.chain_s)
        try:
            if plan.stream and plan.spec is None:
                start = await self._until_gone(request, self.executor.open_stream(plan, trace))
                return StreamingResponse(
                    self.executor.forward(
                        plan, trace, start, lambda c: self._done(plan, trace, c, streamed=start)
                    ),
                    media_type="text/event-stream",
                    headers=self._headers(plan, trace, start.precision),
                )
            completion, texts = await self._until_gone(request, self.executor.buffered(plan, trace))
        except ClientGone:
            self.metrics.client_disconnects.labels(plan.route).inc()
            return Response(status_code=499)
        except UpstreamClientError as exc:
            self.metrics.requests.labels(plan.route, "-", "client_error").inc()
            return self._client_error(plan, trace, exc)
        except UpstreamError as exc:
            return self._all_failed(plan, trace, exc)
        headers = self._headers(plan, trace, completion.precision)
        if plan.stream:  # JSON asked for: buffered, then one clean stream
            chunks = replay_chunks(
                completion, texts, request_id=plan.request_id, include_usage=plan.include_usage
            )
            self._done(plan, trace, completion)
            return StreamingResponse(
                _iterate(chunks), media_type="text/event-stream", headers=headers
            )
        self._done(plan, trace, completion)
        return JSONResponse(
            completion_body(
                completion,
                texts,
                request_id=plan.request_id,
                logprobs=plan.user_logprobs,
                top_k=plan.user_top_logprobs,
            ),
            headers=headers,
        )

    async def text_completions(self, request: Request) -> Response:
        """``POST /v1/completions``: the chain and its upstream fallbacks, no guards (see
        ``completions.py``)."""
        t0 = time.monotonic()
        asked = await self._asked(request, "cmpl")
        if isinstance(asked, Response):
            return asked
        plan = plan_completion(self.config, *asked)
        if isinstance(plan, Refusal):
            return error_response(plan.status, plan.message, plan.type, plan.code, plan.param)
        self.budget.record_request(time.monotonic())
        trace = Trace(t0, t0 + self.config.timeouts.chain_s)
        headers = {"x-request-id": plan.request_id, "x-quantdrift-route": plan.route}
        try:
            precision, first, stream = await self._until_gone(
                request, open_chain(self.executor.walk(plan, trace, COMPLETIONS_PATH))
            )
        except ClientGone:
            self.metrics.client_disconnects.labels(plan.route).inc()
            return Response(status_code=499)
        except UpstreamClientError as exc:
            return self._client_error_body(exc, headers)
        except UpstreamError:
            self.metrics.requests.labels(plan.route, "-", "upstream_error").inc()
            chain = " -> ".join(plan.decision.chain)
            return error_response(
                502,
                f"Every upstream failed ({chain})",
                "upstream_error",
                "upstream_unavailable",
                None,
                headers,
            )
        headers["x-quantdrift-precision"] = precision
        if trace.fallbacks:
            headers["x-quantdrift-fallbacks"] = ",".join(trace.fallbacks)
        self.metrics.requests.labels(plan.route, precision, "ok").inc()
        if plan.stream:
            return StreamingResponse(
                self._text_stream(plan, first, stream),
                media_type="text/event-stream",
                headers=headers,
            )
        try:
            chunks = await self._until_gone(request, drain(first, stream))
        except ClientGone:
            self.metrics.client_disconnects.labels(plan.route).inc()
            return Response(status_code=499)
        except UpstreamError:
            return error_response(
                502,
                "The model stopped answering",
                "upstream_error",
                "upstream_disconnected",
                None,
                headers,
            )
        self.metrics.latency.labels(plan.route, precision, "false").observe(time.monotonic() - t0)
        return JSONResponse(fold(chunks, plan.request_id), headers=headers)

    async def _text_stream(
        self, plan: CompletionPlan, first: list[dict[str, Any]], stream: Chunks
    ) -> AsyncIterator[bytes]:
        usage = None
        try:
            for chunk in first:
                if chunk.get("choices"):
                    yield sse({k: v for k, v in chunk.items() if k != "usage"})
                usage = chunk.get("usage") or usage
            async for chunk in stream:
                if chunk.get("choices"):
                    yield sse({k: v for k, v in chunk.items() if k != "usage"})
                usage = chunk.get("usage") or usage
        except UpstreamError:
            yield STOPPED_MID_STREAM
        finally:
            await stream.aclose()
        if plan.include_usage:
            yield sse(
                {
                    "id": f"cmpl-{plan.request_id}",
                    "object": "text_completion",
                    "choices": [],
                    "usage": usage,
                }
            )
        yield DONE

    async def _until_gone(self, request: Request, work: Awaitable[T]) -> T:
        """Run ``work``; cancel it (and its upstream call) if the client disconnects."""
        task = asyncio.ensure_future(work)
        gone = asyncio.ensure_future(_disconnected(request))
        try:
            done, _ = await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            task.cancel()
            raise
        finally:
            if not gone.done():
                gone.cancel()
        if task in done:
            return task.result()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
        raise ClientGone

    def _done(
        self, plan: Plan, trace: Trace, completion: Completion, streamed: StreamStart | None = None
    ) -> None:
        """Count the served answer and hand it to the shadow runner if sampled."""
        precision = completion.precision
        now = time.monotonic()
        m = self.metrics
        m.requests.labels(plan.route, precision, "ok").inc()
        otel.served(plan, trace, completion)
        m.latency.labels(plan.route, precision, "true" if plan.stream else "false").observe(
            now - trace.t0
        )
        if streamed is not None:
            first = trace.first_token_at
        elif completion.first_token_s is not None:
            first = trace.attempt_t0 + completion.first_token_s
        else:
            first = None
        tokens = completion.completion_tokens
        if first is not None:
            m.ttft.labels(plan.route, precision).observe(max(0.0, first - trace.t0))
            if tokens > 1:
                end = (
                    now if streamed is not None else trace.attempt_t0 + completion.latency_ms / 1000
                )
                m.tpot.labels(plan.route, precision).observe(max(0.0, end - first) / (tokens - 1))
        if tokens:
            m.tokens.labels(plan.route, precision).inc(tokens)
        if plan.shadow or plan.noise:
            for kind, wanted in (("shadow", plan.shadow), ("noise", plan.noise)):
                if wanted:
                    m.shadow_sampled.labels(plan.route, kind).inc()
            self.shadow.submit(plan, completion)

    def _headers(self, plan: Plan, trace: Trace, precision: str | None = None) -> dict[str, str]:
        headers = {"x-request-id": plan.request_id, "x-quantdrift-route": plan.route}
        if plan.client_request_id and _PRINTABLE.match(plan.client_request_id[:200]):
            headers["x-client-request-id"] = plan.client_request_id[:200]
        if precision:
            headers["x-quantdrift-precision"] = precision
        if trace.fallbacks:
            headers["x-quantdrift-fallbacks"] = ",".join(trace.fallbacks)
        if trace.truncated:
            headers["x-quantdrift-truncated"] = "max_tokens"
        if plan.dropped_fields:
            headers["x-quantdrift-dropped-fields"] = header_list(plan.dropped_fields)
        return headers

    def _client_error(self, plan: Plan, trace: Trace, exc: UpstreamClientError) -> JSONResponse:
        return self._client_error_body(exc, self._headers(plan, trace))

    def _client_error_body(self, exc: UpstreamClientError, headers: dict[str, str]) -> JSONResponse:
        """The upstream's 4xx, in OpenAI's shape, with its URLs and hosts taken out."""
        err = exc.body.get("error") if isinstance(exc.body, dict) else None
        if isinstance(err, dict):
            message = scrub(str(err.get("message") or "invalid request"), self._hosts)
            type_ = str(err.get("type") or "invalid_request_error")
            code, param = err.get("code"), err.get("param")
        else:
            message, type_ = "The model server refused the request", "invalid_request_error"
            code, param = "upstream_rejected", None
        return error_response(
            exc.status,
            message,
            type_,
            str(code) if code is not None else None,
            str(param) if param is not None else None,
            headers,
        )

    def _all_failed(self, plan: Plan, trace: Trace, exc: UpstreamError) -> JSONResponse:
        self.metrics.requests.labels(plan.route, "-", "upstream_error").inc()
        chain = " -> ".join(plan.decision.chain)
        if isinstance(exc, ChainDeadline):
            status, code, msg = 504, "deadline_exceeded", f"The request ran out of time ({chain})"
        elif trace.upstream_errors > 0 and trace.timeouts == trace.upstream_errors:
            status, code, msg = 504, "upstream_timeout", f"Every upstream timed out ({chain})"
        else:
            status, code, msg = 502, "upstream_unavailable", f"Every upstream failed ({chain})"
        return error_response(status, msg, "upstream_error", code, None, self._headers(plan, trace))

    # -- models, health, metrics ---------------------------------------------------------

    def models(self, principal: Principal) -> dict[str, Any]:
        return {
            "object": "list",
            "data": [
                {
                    "id": r,
                    "object": "model",
                    "created": int(self.started_at),
                    "owned_by": "quantdrift",
                }
                for r in self.config.routes
                if principal.may_use(r)
            ],
        }

    @property
    def ready(self) -> bool:
        """False when a background task was given up on (see ``supervision.py``)."""
        return self.supervisor.ready

    def health(self, private: bool = True) -> dict[str, Any]:
        """The gateway's view; ``private`` (an authenticated admin) adds who signed what."""
        cfg = self.config
        routes = {}
        gates = self.preflight.health(private)
        for route, rc in cfg.routes.items():
            d = decide(
                order=cfg.order,
                candidate=rc.candidate,
                reference=rc.reference,
                preference="cost_optimized",
                state=self.route_state(route),
                request_id="health",
                candidate_cap=self.preflight.cap(route),
            )
            routes[route] = {
                "serving": d.serve,
                "mode": d.mode,
                "epoch": self.controller.epoch(route) if self.controller else 0,
            }
            gate = gates.get(route)
            if gate is not None:
                routes[route]["preflight"] = gate
        return {
            "status": "ok" if self.ready else "not_ready",
            "failed_tasks": sorted(self.supervisor.failed),
            "routes": routes,
            "precisions": {p: len(u) for p, u in cfg.precisions.items()},
            "kafka_connected": bool(self.publisher and self.publisher.connected),
            "control_ready": bool(self.controller and self.controller.kafka_ready),
            # False: the routes' latest commands are unknown yet; every route on its reference.
            "control_known": self.controller is None or self.controller.backstop_known,
            "shadow_queue": self.shadow.depth,
            "shadow_in_flight": self.shadow.in_flight,
            "auth": self.auth.enabled,
        }

    def _live_metrics(self) -> Iterator[Any]:
        """Numbers other components keep, read at scrape time."""
        yield from self.shadow.collect()
        yield counter(
            "task_crashes",
            "background task crashes (each logged with its traceback, then restarted)",
            ["task"],
            {(k,): float(v) for k, v in self.supervisor.crashes.items()},
        )
        yield gauge("ready", "0 once a task was given up on", [], {(): float(self.ready)})
        dropped = {("queue", r): float(n) for r, n in self.shadow.dropped.items()}
        if self.publisher is not None:
            s = self.publisher.stats
            yield counter("pairs_offered", "pairs offered to the publisher", [], {(): s.offered})
            yield counter("pairs_sent", "pairs acknowledged by Kafka", [], {(): s.sent})
            yield gauge(
                "pairs_queue_depth", "pairs waiting for Kafka", [], {(): self.publisher.queue_depth}
            )
            dropped.update({("publish", r): float(n) for r, n in s.dropped.items()})
        yield counter(
            "shadow_dropped",
            "shadow work dropped, by stage and reason",
            ["stage", "reason"],
            dropped,
        )
        if self.degradations is not None:
            d = self.degradations.stats
            yield counter(
                "degradation_events",
                "degradation events, by outcome",
                ["outcome"],
                {("sent",): d.sent, ("dropped",): d.dropped_total},
            )
        if self.preflight.status:
            yield gauge(
                "preflight_verified",
                "1 when the route's preflight report verifies (else its candidate is capped)",
                ["route"],
                {(r,): float(st.verified) for r, st in self.preflight.status.items()},
            )
        ejected = {
            (p,): float(pool.outliers.ejected_total) for p, pool in self.upstreams.pools.items()
        }
        yield counter(
            "upstream_ejections", "servers ejected by outlier detection", ["precision"], ejected
        )
        if self.controller is not None:
            # 0 while commands reach this gateway only through the Redis backstop:
            # the alert rules page on it (deploy/prometheus/alerts.yml).
            yield gauge(
                "control_ready",
                "1 while the control topic is followed",
                [],
                {(): float(self.controller.kafka_ready)},
            )
            yield gauge(
                "route_epoch",
                "epoch of the route's applied command",
                ["route"],
                {(r,): self.controller.epoch(r) for r in self.config.routes},
            )
            yield counter(
                "commands_refused",
                "control commands refused, by reason",
                ["reason"],
                {(k,): v for k, v in self.controller.verifier.refused.items()},
            )


async def _iterate(chunks: list[bytes]) -> AsyncIterator[bytes]:
    for c in chunks:
        yield c


async def _disconnected(request: Request) -> None:
    """Return once the client has gone (the body is already read: nothing else arrives)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


# -- the apps ----------------------------------------------------------------------------


def _openai_errors(app: FastAPI) -> None:
    """404/405/422/500 in OpenAI's shape, with nothing internal in them."""

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        return error_response(exc.status_code, str(exc.detail), "invalid_request_error", code)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(400, "Invalid request", "invalid_request_error", "invalid_value")

    @app.exception_handler(Exception)
    async def _bug(_: Request, exc: Exception) -> JSONResponse:
        log.exception("gateway: unhandled error")
        return error_response(
            500, "The gateway failed on this request", "server_error", "internal_error"
        )


def _admin_routes(app: FastAPI, gateway: Gateway) -> None:
    def denied() -> JSONResponse:
        gateway.metrics.auth_refusals.labels("admin").inc()
        return error_response(
            401, "This endpoint needs the admin token", "invalid_request_error", "invalid_api_key"
        )

    @app.get("/health", response_model=None)
    async def health(request: Request) -> Any:
        if not gateway.auth.admin_ok(request.headers.get("authorization")):
            return denied()
        body = gateway.health(private=gateway.auth.admin_protected)
        return JSONResponse(body, 200 if gateway.ready else 503)

    @app.get("/metrics", response_model=None)
    async def metrics(request: Request) -> Response:
        if not gateway.auth.admin_ok(request.headers.get("authorization")):
            return denied()
        return Response(gateway.metrics.render(), media_type=CONTENT_TYPE)


def create_app(gateway: Gateway) -> FastAPI:
    """The API app; its lifespan starts and stops the gateway's components.

    ``/health`` and ``/metrics`` are here too unless ``admin_listen`` puts them on
    their own port (``create_admin_app``).
    """

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await gateway.start()
        try:
            yield
        finally:
            await gateway.stop()

    app = FastAPI(
        title="quantdrift gateway",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )
    app.state.gateway = gateway
    _openai_errors(app)

    @app.post("/v1/chat/completions", response_model=None)
    async def chat(request: Request) -> Response:
        return await gateway.chat(request)

    @app.post("/v1/completions", response_model=None)
    async def completions(request: Request) -> Response:
        return await gateway.text_completions(request)

    @app.get("/v1/models", response_model=None)
    async def models(request: Request) -> Any:
        principal = gateway.principal(request)
        if principal is None:
            return gateway._refuse_auth()
        return gateway.models(principal)

    @app.get("/v1/models/{model:path}", response_model=None)
    async def model(model: str, request: Request) -> Any:
        principal = gateway.principal(request)
        if principal is None:
            return gateway._refuse_auth()
        for m in gateway.models(principal)["data"]:
            if m["id"] == model:
                return m
        return error_response(
            404,
            f"The model {model!r} does not exist",
            "invalid_request_error",
            "model_not_found",
            "model",
        )

    if gateway.config.admin_listen is None:
        _admin_routes(app, gateway)
    return app


def create_admin_app(gateway: Gateway) -> FastAPI:
    """``/health`` and ``/metrics`` alone, for ``admin_listen`` (no lifespan: the API app's)."""
    app = FastAPI(title="quantdrift gateway admin", docs_url=None, redoc_url=None, openapi_url=None)
    _openai_errors(app)
    _admin_routes(app, gateway)
    return app


async def json_object(request: Request, max_bytes: int) -> dict[str, Any] | Response:
    """The request body as a JSON object, or the 4xx that says why it is not one.

    The body is read up to ``max_bytes`` (413 past it, before the rest is held in
    memory) and parsed with orjson, which is strict where ``json`` is lenient: it
    refuses NaN and Infinity, lone surrogates and nesting deeper than 1024, so none
    of them reaches planning, an upstream or a pair.
    """
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > max_bytes:
        return _too_large(max_bytes)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:
            return _too_large(max_bytes)
        chunks.append(chunk)
    request.state.body_bytes = size
    try:
        body = orjson.loads(b"".join(chunks))
    except orjson.JSONDecodeError as exc:
        return error_response(
            400, f"The body is not valid JSON ({exc})", "invalid_request_error", "invalid_json"
        )
    if not isinstance(body, dict):
        return error_response(
            400, "The body must be a JSON object", "invalid_request_error", "invalid_json"
        )
    return body


def _too_large(max_bytes: int) -> JSONResponse:
    return error_response(
        413,
        f"The body is larger than {max_bytes} bytes",
        "invalid_request_error",
        "request_too_large",
    )


_HEADER_TOKEN = re.compile(r"^[A-Za-z0-9_.:@/-]{1,64}$")
_PRINTABLE = re.compile(r"^[\x20-\x7e]+$")


def header_list(names: Iterable[str], limit: int = 500) -> str:
    """Names safe for a response header, comma-joined; any other name is counted, not echoed.

    Nothing the caller typed reaches a header unless it is a plain token: a key
    holding CR/LF (header injection) or a non-latin-1 character (which the server
    cannot encode) shows up as ``+N-unprintable``.

    >>> header_list(["top_k", "bad\\r\\nx: 1", "ключ"])
    'top_k,+2-unprintable'
    """
    names = list(names)
    safe = [n for n in names if _HEADER_TOKEN.match(n)]
    other = len(names) - len(safe)
    return ",".join(safe + ([f"+{other}-unprintable"] if other else []))[:limit]
