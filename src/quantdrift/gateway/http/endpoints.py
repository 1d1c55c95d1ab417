"""The request flows behind the routes: chat completions, text completions, models.

One request, in order: authenticate (``auth.py``, 401), read the body
(``edge.json_object``), plan (``planning.py`` / ``completions.py``, pure:
4xx refusals), walk the fallback chain (``executor.py`` over ``attempts.py``),
answer (``openai_wire.py``), count it (``observability.served``) and hand a
sampled request to the shadow runner (``shadow.py``) after the user's answer is
complete. While the gateway itself is overloaded (``overload.py``) a request is
shed with a 503 ``overloaded`` and ``Retry-After``, at the door or when its own
lag made an attempt time out. A client that disconnects first gets 499 and its upstream call is
cancelled; every error it sees comes from ``openai_errors.py``.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from quantdrift.errors import GatewayOverloaded, UpstreamError
from quantdrift.gateway.chain.attempts import Chunks, Trace
from quantdrift.gateway.chain.completions import PATH as COMPLETIONS_PATH
from quantdrift.gateway.chain.completions import (
    CompletionPlan,
    drain,
    fold,
    open_chain,
    plan_completion,
)
from quantdrift.gateway.chain.executor import StreamStart
from quantdrift.gateway.chain.planning import Incoming, Plan, Refusal, plan_request
from quantdrift.gateway.guards.auth import Principal
from quantdrift.gateway.http.edge import (
    ClientGone,
    declared_too_large,
    json_object,
    response_headers,
    until_gone,
)
from quantdrift.gateway.http.observability import served
from quantdrift.gateway.http.openai_errors import (
    all_failed,
    client_error,
    error_response,
    overloaded,
    refuse_auth,
    too_large,
)
from quantdrift.gateway.http.service import Gateway
from quantdrift.gateway.openai_wire import (
    DONE,
    STOPPED_MID_STREAM,
    Completion,
    completion_body,
    replay_chunks,
    sse,
)
from quantdrift.gateway.upstream.pools import UpstreamClientError


class Endpoints:
    """The handlers ``create_app`` routes to, over one Gateway's parts."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self.config = gateway.config
        self.auth = gateway.auth
        self.metrics = gateway.metrics
        self.budget = gateway.budget
        self.executor = gateway.executor
        self.shadow = gateway.shadow
        self.preflight = gateway.preflight
        self.sample_salt = gateway.sample_salt
        self.started_at = gateway.started_at
        self.hosts = gateway.hosts

    def principal(self, request: Request) -> Principal | None:
        return self.auth.principal(request.headers.get("authorization"))

    async def asked(
        self, request: Request, id_prefix: str
    ) -> tuple[dict[str, Any], Incoming] | Response:
        """The JSON body and what planning reads besides it, or the 401/4xx refusing them."""
        principal = self.principal(request)
        if principal is None:
            return refuse_auth(self.metrics)
        max_bytes = self.config.limits.max_body_bytes
        if declared_too_large(request, max_bytes):
            # Before shedding: a 503 asks the client to retry, and an SDK that does would
            # upload a body that can never be served again.
            self.metrics.requests.labels("-", "-", "too_large").inc()
            return too_large(max_bytes)
        if self.gateway.loop_lag.overloaded(time.monotonic()):
            # Shed at the door, before the body is read: refusing costs little, and every
            # request let in while the loop runs late makes every other one later.
            return self._overloaded("admission")
        body = await json_object(request, max_bytes)
        if isinstance(body, Response):
            outcome = "too_large" if body.status_code == 413 else "bad_request"
            self.metrics.requests.labels("-", "-", outcome).inc()
            return body
        incoming = Incoming(
            {k.lower(): v for k, v in request.headers.items()},
            principal,
            f"{id_prefix}-{uuid.uuid4().hex}",
            self.gateway.directive,
            self.preflight.cap,
            self.gateway.filling,
            self.gateway.tasks.admit,
            self.gateway.share,
        )
        return body, incoming

    async def chat(self, request: Request) -> Response:
        t0 = time.monotonic()
        asked = await self.asked(request, "req")
        if isinstance(asked, Response):
            return asked
        plan = plan_request(self.config, *asked, sample_salt=self.sample_salt)
        if isinstance(plan, Refusal):
            outcome = "forbidden" if plan.status == 403 else "bad_request"
            if plan.status == 403:
                self.metrics.auth_refusals.labels(plan.code).inc()
            self.metrics.requests.labels("-", "-", outcome).inc()
            return error_response(plan.status, plan.message, plan.type, plan.code, plan.param)
        # A queued shadow job holds the request to re-ask the reference: past
        # max_shadow_body_bytes it is not mirrored (counted).
        plan = self.shadow.admit(plan, getattr(request.state, "body_bytes", 0))
        self.budget.record_request(time.monotonic())
        trace = Trace(t0, t0 + self.config.timeouts.chain_s)
        try:
            if plan.stream and plan.spec is None:
                start = await until_gone(request, self.executor.open_stream(plan, trace))
                return StreamingResponse(
                    self.executor.forward(
                        plan, trace, start, lambda c: self._done(plan, trace, c, streamed=start)
                    ),
                    media_type="text/event-stream",
                    headers=response_headers(plan, trace, start.precision),
                )
            completion, texts = await until_gone(request, self.executor.buffered(plan, trace))
        except (ClientGone, UpstreamClientError, GatewayOverloaded, UpstreamError) as exc:
            headers = response_headers(plan, trace)
            return self._failed(
                exc,
                plan.route,
                headers,
                lambda e: all_failed(self.metrics, plan, trace, e, headers),
            )
        headers = response_headers(plan, trace, completion.precision)
        if plan.stream:  # JSON asked for: buffered, then one clean stream
            chunks = replay_chunks(
                completion, texts, request_id=plan.request_id, include_usage=plan.include_usage
            )
            self._done(plan, trace, completion)
            return StreamingResponse(
                iterate(chunks), media_type="text/event-stream", headers=headers
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
        asked = await self.asked(request, "cmpl")
        if isinstance(asked, Response):
            return asked
        plan = plan_completion(self.config, *asked)
        if isinstance(plan, Refusal):
            return error_response(plan.status, plan.message, plan.type, plan.code, plan.param)
        self.budget.record_request(time.monotonic())
        trace = Trace(t0, t0 + self.config.timeouts.chain_s)
        headers = {"x-request-id": plan.request_id, "x-quantdrift-route": plan.route}
        try:
            precision, first, stream = await until_gone(
                request, open_chain(self.executor.walk(plan, trace, COMPLETIONS_PATH))
            )
        except (ClientGone, UpstreamClientError, GatewayOverloaded, UpstreamError) as exc:
            return self._failed(
                exc, plan.route, headers, lambda _: self._chain_failed(plan, headers)
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
            chunks = await until_gone(request, drain(first, stream))
        except ClientGone:
            self.metrics.client_disconnects.labels(plan.route).inc()
            return Response(status_code=499)
        except GatewayOverloaded:
            return self._overloaded("in_flight", headers)
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
        except (UpstreamError, GatewayOverloaded):
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

    def _failed(
        self,
        exc: Exception,
        route: str,
        headers: dict[str, str],
        upstream: Callable[[UpstreamError], Response],
    ) -> Response:
        """The one error ladder under every completion endpoint: a client gone (499), a
        request its upstream refused (the upstream's 4xx, hosts scrubbed), the gateway
        overloaded (503 with Retry-After), every upstream failed (``upstream``: each
        endpoint words its own 502). Each is counted once, per route."""
        if isinstance(exc, ClientGone):
            self.metrics.client_disconnects.labels(route).inc()
            return Response(status_code=499)
        if isinstance(exc, UpstreamClientError):
            self.metrics.requests.labels(route, "-", "client_error").inc()
            return client_error(exc, self.hosts, headers)
        if isinstance(exc, GatewayOverloaded):
            self.metrics.requests.labels(route, "-", "overloaded").inc()
            return self._overloaded("in_flight", headers)
        assert isinstance(exc, UpstreamError)
        return upstream(exc)

    def _chain_failed(self, plan: CompletionPlan, headers: dict[str, str]) -> Response:
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

    def _overloaded(self, stage: str, headers: dict[str, str] | None = None) -> Response:
        return overloaded(self.metrics, stage, self.config.overload.retry_after_s, headers)

    def _done(
        self, plan: Plan, trace: Trace, completion: Completion, streamed: StreamStart | None = None
    ) -> None:
        """Count the served answer and hand it to the shadow runner if sampled."""
        served(self.metrics, plan, trace, completion, streamed=streamed is not None)
        if plan.shadow or plan.noise:
            self.shadow.submit(plan, completion)

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


async def iterate(chunks: list[bytes]) -> AsyncIterator[bytes]:
    for c in chunks:
        yield c
