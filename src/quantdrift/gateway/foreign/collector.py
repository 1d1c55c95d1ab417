"""The collector: shadow pairs behind a gateway quantdrift does not own.

nginx (``mirror``), Envoy (``request_mirror_policies``) and the Gateway API
(``RequestMirror``) can copy a request to another address and throw its answer
away. The collector is that address. For each mirrored
``POST /v1/chat/completions`` it:

1. passes the gateway's own door (``Endpoints.asked``: API keys, the loop-lag shed,
   the body read within ``limits.max_body_bytes``) and plans the request with the
   gateway's ``plan_request`` (route, privacy header, sampling at the route's
   ``shadow_sample_rate`` and ``noise_sample_rate``, the route's directive);
2. hands a sampled request to the gateway's ``ShadowRunner`` with no user answer,
   so the runner asks the candidate *and* the reference itself and builds the pair
   exactly as in the gateway (same wire, teacher forcing, prompt hashing, limits);
3. answers ``202`` at once, whatever happens next.

Nothing after the body read waits: the runner's queue is bounded and drops its
oldest job when full (``shadow_dropped{stage="queue",reason="queue_full"}``), the
shed at the door answers 503 while the event loop runs late, and every mirrored
request is counted by outcome (``collector_requests``). A slow reference fills the
queue and loses pairs; it never slows the collector's answer, and so never holds
the mirroring gateway's connection (nginx keeps a client's keep-alive connection
until its mirror subrequests finish: docs/collector.md).

A route rolled back (or, at start, not known yet) does not call its candidate:
the directive comes from the same ``RouteController`` as the gateway's.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from quantdrift.gateway.chain.planning import Plan, Refusal, plan_request
from quantdrift.gateway.http.app import admin_routes, base_app
from quantdrift.gateway.http.endpoints import Endpoints
from quantdrift.gateway.http.openai_errors import error_response
from quantdrift.gateway.http.service import Gateway

# Outcomes (quantdrift_gateway_collector_requests_total{route,outcome}).
ACCEPTED = "accepted"  # queued for a dual run
NOT_SAMPLED = "not_sampled"
SUSPENDED = "suspended"  # the route's candidate may not run (rolled back, control unknown)
TOO_LARGE = "too_large"  # past limits.max_shadow_body_bytes
REFUSED = "refused"  # a 4xx: bad body, unknown route, a key that may not use it
UNAUTHORIZED = "unauthorized"
SHED = "shed"  # the collector's own loop ran late: 503 at the door
_BY_STATUS = {401: UNAUTHORIZED, 503: SHED}


def outcome_of(before: Plan, after: Plan) -> str:
    """What became of a planned request (``after``: as the shadow runner admitted it).

    >>> from types import SimpleNamespace as NS
    >>> p = lambda shadow, noise=False, cand="int4": NS(
    ...     shadow=shadow, noise=noise, decision=NS(pair_candidate=cand))
    >>> outcome_of(p(True), p(True)), outcome_of(p(True), p(False)), outcome_of(p(False), p(False))
    ('accepted', 'too_large', 'not_sampled')
    >>> outcome_of(p(False, cand=None), p(False, cand=None))
    'suspended'
    """
    if after.shadow or after.noise:
        return ACCEPTED
    if before.shadow or before.noise:
        return TOO_LARGE
    if after.decision.pair_candidate is None:
        return SUSPENDED
    return NOT_SAMPLED


class Collector:
    """The mirrored-request handler over one Gateway's parts (no user is served here)."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self.door = Endpoints(gateway)

    def _count(self, route: str, outcome: str) -> None:
        self.gateway.metrics.mirrored.labels(route, outcome).inc()

    async def mirrored(self, request: Request) -> Response:
        """Plan, queue if sampled, answer 202: the only await is the body read."""
        asked = await self.door.asked(request, "mir")
        if isinstance(asked, Response):
            self._count("-", _BY_STATUS.get(asked.status_code, REFUSED))
            return asked
        gw = self.gateway
        planned = plan_request(gw.config, *asked, sample_salt=gw.sample_salt)
        if isinstance(planned, Refusal):
            self._count("-", REFUSED)
            p = planned
            return error_response(p.status, p.message, p.type, p.code, p.param)
        plan = gw.shadow.admit(planned, getattr(request.state, "body_bytes", 0))
        outcome = outcome_of(planned, plan)
        if outcome == ACCEPTED:
            gw.shadow.submit(plan, None)
            for kind, wanted in (("shadow", plan.shadow), ("noise", plan.noise)):
                if wanted:
                    gw.metrics.shadow_sampled.labels(plan.route, kind).inc()
        self._count(plan.route, outcome)
        body: dict[str, Any] = {"id": plan.request_id, "route": plan.route, "outcome": outcome}
        return JSONResponse(body, 202, headers={"x-request-id": plan.request_id})


def create_collector_app(gateway: Gateway) -> FastAPI:
    """The collector's app: ``POST /v1/chat/completions`` (202), ``/health``, ``/metrics``
    (those two on ``admin_listen`` instead when set). Its lifespan starts and stops the
    gateway's parts: pools, shadow runner, publisher, route controller, noise fill."""

    app = base_app(gateway, "quantdrift collector")
    collector = Collector(gateway)

    @app.post("/v1/chat/completions", response_model=None)
    async def chat(request: Request) -> Response:
        return await collector.mirrored(request)

    if gateway.config.admin_listen is None:
        admin_routes(app, gateway)
    return app
