"""Every error a client sees, in OpenAI's shape, with nothing internal in it.

The framework's own 404/405/422/500 (``openai_errors``), a refused key, an
upstream's 4xx passed on with its URLs and hosts taken out, the 502/504
that says how a whole chain failed, and the 503 of a gateway that sheds load.
An SDK reads ``error.type`` / ``code`` / ``param`` from all of them alike.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from quantdrift.errors import UpstreamError
from quantdrift.gateway.chain.attempts import ChainDeadline, Trace
from quantdrift.gateway.chain.planning import Plan
from quantdrift.gateway.openai_wire import error_body, scrub
from quantdrift.gateway.telemetry import Telemetry
from quantdrift.gateway.upstream.pools import UpstreamClientError

log = logging.getLogger(__name__)


def error_response(
    status: int,
    message: str,
    type_: str,
    code: str | None = None,
    param: str | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    return JSONResponse(error_body(message, type_, code, param), status, headers=headers)


def openai_errors(app: FastAPI) -> None:
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


def refuse_auth(metrics: Telemetry) -> JSONResponse:
    """401 for a missing or unknown API key (counted)."""
    metrics.auth_refusals.labels("invalid_api_key").inc()
    return error_response(
        401,
        "Incorrect API key provided. Send it as 'Authorization: Bearer <key>'.",
        "invalid_request_error",
        "invalid_api_key",
    )


def client_error(
    exc: UpstreamClientError, hosts: Iterable[str], headers: dict[str, str]
) -> JSONResponse:
    """The upstream's 4xx, in OpenAI's shape, with its URLs and hosts taken out."""
    err = exc.body.get("error") if isinstance(exc.body, dict) else None
    if isinstance(err, dict):
        message = scrub(str(err.get("message") or "invalid request"), hosts)
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


def all_failed(
    metrics: Telemetry, plan: Plan, trace: Trace, exc: UpstreamError, headers: dict[str, str]
) -> JSONResponse:
    """502 or 504 once every upstream of the chain failed: which, by how they failed."""
    metrics.requests.labels(plan.route, "-", "upstream_error").inc()
    chain = " -> ".join(plan.decision.chain)
    if isinstance(exc, ChainDeadline):
        status, code, msg = 504, "deadline_exceeded", f"The request ran out of time ({chain})"
    elif trace.upstream_errors > 0 and trace.timeouts == trace.upstream_errors:
        status, code, msg = 504, "upstream_timeout", f"Every upstream timed out ({chain})"
    else:
        status, code, msg = 502, "upstream_unavailable", f"Every upstream failed ({chain})"
    return error_response(status, msg, "upstream_error", code, None, headers)


def overloaded(
    metrics: Telemetry, stage: str, retry_after_s: int, headers: dict[str, str] | None = None
) -> JSONResponse:
    """503 ``overloaded`` with ``Retry-After``: the gateway sheds load on purpose (counted).

    Never a 502: the upstreams are not what failed, and a client that retries after
    ``Retry-After`` (every OpenAI SDK does on 503) lands when the gateway has room.
    """
    metrics.shed.labels(stage).inc()
    return error_response(
        503,
        f"The gateway is overloaded; retry after {retry_after_s} s",
        "server_error",
        "overloaded",
        None,
        {**(headers or {}), "retry-after": str(retry_after_s)},
    )


def too_large(max_bytes: int) -> JSONResponse:
    return error_response(
        413,
        f"The body is larger than {max_bytes} bytes",
        "invalid_request_error",
        "request_too_large",
    )
