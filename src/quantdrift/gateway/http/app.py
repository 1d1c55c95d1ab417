"""The gateway's HTTP surface: ``create_app`` (the API) and ``create_admin_app``.

Endpoints: ``POST /v1/chat/completions`` (streaming and not),
``POST /v1/completions``, ``GET /v1/models`` (the routes the caller's key may
use, as models), ``GET /health`` and ``GET /metrics`` (on the API port, or only
on ``admin_listen`` when set; behind ``auth.admin_token_sha256`` when set).

Only the routing table is here. The request flows are ``endpoints.py``, the
errors a client sees ``openai_errors.py``, health and metrics
``observability.py``, and the parts they run over, started and stopped by the
app's lifespan, ``service.Gateway``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from quantdrift.gateway.http import observability
from quantdrift.gateway.http.endpoints import Endpoints
from quantdrift.gateway.http.lingering import CloseUnread
from quantdrift.gateway.http.openai_errors import error_response, openai_errors, refuse_auth
from quantdrift.gateway.http.service import Gateway
from quantdrift.gateway.telemetry import CONTENT_TYPE


def admin_routes(app: FastAPI, gateway: Gateway) -> None:
    def denied() -> JSONResponse:
        gateway.metrics.auth_refusals.labels("admin").inc()
        return error_response(
            401, "This endpoint needs the admin token", "invalid_request_error", "invalid_api_key"
        )

    @app.get("/health", response_model=None)
    async def health(request: Request) -> Any:
        if not gateway.auth.admin_ok(request.headers.get("authorization")):
            return denied()
        body = observability.health(gateway, private=gateway.auth.admin_protected)
        return JSONResponse(body, 200 if gateway.ready else 503)

    @app.get("/metrics", response_model=None)
    async def metrics(request: Request) -> Response:
        if not gateway.auth.admin_ok(request.headers.get("authorization")):
            return denied()
        return Response(gateway.metrics.render(), media_type=CONTENT_TYPE)


def base_app(gateway: Gateway, title: str) -> FastAPI:
    """What the gateway's and the collector's apps share: a lifespan that starts and
    stops the gateway's parts, OpenAI-shaped errors, and early answers that close."""

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await gateway.start()
        try:
            yield
        finally:
            await gateway.stop()

    app = FastAPI(
        title=title,
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )
    app.state.gateway = gateway
    # An answer sent before the body was read (413, 401, 503) closes the connection,
    # and the server's lingering close lets the client read it (``lingering.py``).
    app.add_middleware(CloseUnread)
    openai_errors(app)
    return app


def create_app(gateway: Gateway) -> FastAPI:
    """The API app; its lifespan starts and stops the gateway's components.

    ``/health`` and ``/metrics`` are here too unless ``admin_listen`` puts them on
    their own port (``create_admin_app``).
    """

    app = base_app(gateway, "quantdrift gateway")
    endpoints = Endpoints(gateway)

    @app.post("/v1/chat/completions", response_model=None)
    async def chat(request: Request) -> Response:
        return await endpoints.chat(request)

    @app.post("/v1/completions", response_model=None)
    async def completions(request: Request) -> Response:
        return await endpoints.text_completions(request)

    @app.get("/v1/models", response_model=None)
    async def models(request: Request) -> Any:
        principal = endpoints.principal(request)
        if principal is None:
            return refuse_auth(gateway.metrics)
        return endpoints.models(principal)

    @app.get("/v1/models/{model:path}", response_model=None)
    async def model(model: str, request: Request) -> Any:
        principal = endpoints.principal(request)
        if principal is None:
            return refuse_auth(gateway.metrics)
        for m in endpoints.models(principal)["data"]:
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
        admin_routes(app, gateway)
    return app


def create_admin_app(gateway: Gateway) -> FastAPI:
    """``/health`` and ``/metrics`` alone, for ``admin_listen`` (no lifespan: the API app's)."""
    app = FastAPI(title="quantdrift gateway admin", docs_url=None, redoc_url=None, openapi_url=None)
    openai_errors(app)
    admin_routes(app, gateway)
    return app
