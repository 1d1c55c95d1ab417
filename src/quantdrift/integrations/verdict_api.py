"""The verdict API: a small stateless HTTP process rollout controllers ask about a route.

``quantdrift verdict-api`` serves, behind one bearer token:

* ``GET  /api/v1/routes/{route}/verdict``      the route's verdict (``verdict.py``)
* ``GET  /api/v1/routes/{route}/worst-pairs``  the pairs behind it
* ``GET  /api/v1/routes/{route}/audit``        the audit trail (newest first)
* ``POST /api/v1/flagger/{hook}``              Flagger webhooks: ``pre-rollout``,
  ``confirm-promotion``, ``rollback``, ``event``
* ``GET  /healthz``                            Redis reachable (no token)

A route given a quantization certificate (``--certificate ROUTE=CERT``) has it
checked on every call: it informs the verdict and may start a rollout, never
pass one (``certified.py``).

It holds no state of its own: every answer reads the breaker's route state and
latest signed command from Redis through the breaker store's read methods, so
any number of replicas answer alike. It never writes breaker state; it appends
webhook answers and Flagger events to the route's audit stream
(``route_key(prefix, route, "audit")``, capped).

Flagger sends no custom headers with a webhook, so a Flagger call may carry the
token as ``metadata.token`` instead of ``Authorization: Bearer``; Argo's ``web``
provider sends the header. A Redis that cannot be read answers 503, which
Argo counts as an Error measurement and Flagger as a failed check: never a pass.
"""

from __future__ import annotations

import hmac
import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from redis.exceptions import RedisError

from quantdrift.breaker.policy import Policy
from quantdrift.breaker.store import RedisBreakerStore
from quantdrift.config import SigningSettings
from quantdrift.errors import BreakerStoreError, ConfigError, QuantdriftError
from quantdrift.integrations import certified
from quantdrift.integrations.verdict import (
    FLAGGER_HOOKS,
    RouteVerdict,
    flagger_answer,
    route_verdict,
)
from quantdrift.schemas.command import RouteCommand
from quantdrift.schemas.ed25519 import TrustedKey
from quantdrift.schemas.keys import route_key
from quantdrift.schemas.signing import (
    CommandVerifier,
    signer_from_settings,
    verifier_from_settings,
)
from quantdrift.schemas.signoff import trusted, verify_file

log = logging.getLogger(__name__)
API = "/api/v1"
AUDIT_MAXLEN = 10_000


@dataclass(frozen=True, slots=True)
class PreflightRule:
    """Which report must verify before a route's canary takes traffic, and how."""

    report: Path
    required_signers: int = 2
    distinct_keys: bool = False


@dataclass
class VerdictService:
    """Reads a route's state and command, verifies preflight reports, keeps the audit trail."""

    store: RedisBreakerStore
    redis: aioredis.Redis
    key_prefix: str
    policy: Policy
    verifier: CommandVerifier
    keys: Mapping[str, TrustedKey]
    preflight: Mapping[str, PreflightRule]
    clock: Callable[[], float] = time.time
    # Per route, the quantization certificate a rollout starts from (``certified.py``).
    certificates: Mapping[str, Path] = field(default_factory=dict)

    async def verdict(self, route: str) -> RouteVerdict:
        state, version = await self.store.read(route)
        raw = await self.store.latest_command(route)
        floors = await self.store.read_floors(route)
        command = self._command(route, raw)
        verdict = route_verdict(
            route, state, version, self.policy.for_route(route), command, floors
        )
        return self._certified(route, verdict, state.candidate_engine or None)

    def _certified(self, route: str, verdict: RouteVerdict, serving: str | None) -> RouteVerdict:
        """The verdict informed by the route's certificate, when one is given."""
        path = self.certificates.get(route)
        if path is None:
            return verdict
        return certified.inform(verdict, certified.from_file(path, self.keys, route, serving))

    def _command(self, route: str, raw: bytes | None) -> RouteCommand | None:
        """The latest command, only if its signature holds: a forged one is not evidence."""
        if raw is None:
            return None
        try:
            command = self.verifier.open(raw)
        except QuantdriftError as exc:
            log.warning("verdict api: route %s: latest command refused: %s", route, exc)
            return None
        return command if command.route == route else None

    def preflight_status(self, route: str) -> tuple[bool | None, tuple[str, ...]]:
        """(verified, problems) for the route's report; (None, ()) when none is configured.

        The same check as ``quantdrift preflight verify`` and the gateway's launch
        gate (``schemas.signoff.verify_file``), re-read on every call.
        """
        rule = self.preflight.get(route)
        if rule is None and route in self.certificates:
            # A rollout that starts from a certificate: its signed preflight stands in.
            c = certified.from_file(self.certificates[route], self.keys, route, None)
            return c.verified, (() if c.verified else (f"certificate refused: {c.refused}",))
        if rule is None:
            return None, ()
        result = verify_file(
            rule.report, self.keys, required=rule.required_signers, distinct_keys=rule.distinct_keys
        )
        return result.ok, tuple(result.problems)

    async def record(self, route: str, entry: dict[str, Any]) -> str:
        """Append one entry to the route's audit stream; its stream id."""
        key = route_key(self.key_prefix, route, "audit")
        body = json.dumps({"ts": self.clock(), **entry}, sort_keys=True, default=str)
        try:
            entry_id = await self.redis.xadd(
                key, {"entry": body}, maxlen=AUDIT_MAXLEN, approximate=True
            )
        except RedisError as exc:
            raise BreakerStoreError(f"redis: {exc}") from exc
        return entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)

    async def audit(self, route: str, count: int = 100) -> list[dict[str, Any]]:
        key = route_key(self.key_prefix, route, "audit")
        try:
            rows = await self.redis.xrevrange(key, count=count)
        except RedisError as exc:
            raise BreakerStoreError(f"redis: {exc}") from exc
        out = []
        for entry_id, fields in rows or []:
            raw = (fields or {}).get(b"entry") or b"{}"
            out.append(
                {
                    "id": entry_id.decode() if isinstance(entry_id, bytes) else entry_id,
                    **json.loads(raw),
                }
            )
        return out

    async def ping(self) -> bool:
        try:
            return bool(await self.redis.ping())
        except RedisError:
            return False


def _unauthorized(why: str) -> JSONResponse:
    return JSONResponse(
        {"error": "unauthorized", "detail": why},
        status_code=401,
        headers={"WWW-Authenticate": "Bearer"},
    )


def _token_ok(token: str, request: Request, payload: Mapping[str, Any] | None) -> str | None:
    """None when the request carries the token, else why not (constant-time compare)."""
    header = request.headers.get("authorization", "")
    given = ""
    if header.lower().startswith("bearer "):
        given = header[7:].strip()
    elif payload is not None:
        meta = payload.get("metadata") or {}
        given = str(meta.get("token", "")) if isinstance(meta, Mapping) else ""
    if not given:
        return "missing bearer token"
    if not hmac.compare_digest(given.encode(), token.encode()):
        return "wrong bearer token"
    return None


def create_app(service: VerdictService, token: str, public_url: str = "") -> FastAPI:
    """The verdict API over ``service``; ``token`` is required (an empty one is refused)."""
    if not token:
        raise ConfigError("the verdict API needs a bearer token; refusing to serve without one")
    app = FastAPI(title="quantdrift verdict API", docs_url=None, redoc_url=None)
    base = public_url.rstrip("/")

    @app.exception_handler(BreakerStoreError)
    async def store_down(request: Request, exc: BreakerStoreError) -> JSONResponse:
        # Every endpoint alike: a Redis that cannot be read is a 503, never a pass.
        return JSONResponse({"error": "store unavailable", "detail": str(exc)}, status_code=503)

    @app.get("/healthz")
    async def healthz() -> JSONResponse:
        ok = await service.ping()
        return JSONResponse({"redis": ok}, status_code=200 if ok else 503)

    @app.get(API + "/routes/{route:path}/verdict")
    async def get_verdict(route: str, request: Request) -> JSONResponse:
        if why := _token_ok(token, request, None):
            return _unauthorized(why)
        verdict = await service.verdict(route)
        return JSONResponse(verdict.as_json(f"{base}{API}/routes/{route}/worst-pairs"))

    @app.get(API + "/routes/{route:path}/worst-pairs")
    async def get_worst(route: str, request: Request) -> JSONResponse:
        if why := _token_ok(token, request, None):
            return _unauthorized(why)
        verdict = await service.verdict(route)
        last = verdict.last_transition or {}
        return JSONResponse(
            {
                "route": route,
                "epoch": verdict.epoch,
                "worst_pairs": verdict.worst_pairs,
                "decisive_pair_id": (last.get("evidence") or {}).get("decisive_pair_id"),
            }
        )

    @app.get(API + "/routes/{route:path}/audit")
    async def get_audit(route: str, request: Request, count: int = 100) -> JSONResponse:
        if why := _token_ok(token, request, None):
            return _unauthorized(why)
        entries = await service.audit(route, max(1, min(count, 1000)))
        return JSONResponse({"route": route, "entries": entries})

    @app.post(API + "/flagger/{hook}")
    async def flagger(hook: str, request: Request) -> JSONResponse:
        try:
            payload = json.loads(await request.body() or b"{}")
        except ValueError:
            return JSONResponse({"error": "the body is not JSON"}, status_code=400)
        if not isinstance(payload, dict):
            return JSONResponse({"error": "the body is not a JSON object"}, status_code=400)
        if why := _token_ok(token, request, payload):
            return _unauthorized(why)
        if hook not in FLAGGER_HOOKS:
            return JSONResponse(
                {"error": f"unknown hook {hook!r}", "known": list(FLAGGER_HOOKS)},
                status_code=404,
            )
        meta = payload.get("metadata") or {}
        route = meta.get("route") if isinstance(meta, dict) else None
        if not route:
            return JSONResponse(
                {"error": "the webhook's metadata must name the route: metadata.route"},
                status_code=400,
            )
        canary = {k: payload.get(k) for k in ("name", "namespace", "phase", "checksum")}
        if hook == "event":
            event = {k: v for k, v in meta.items() if k != "token"}
            entry_id = await service.record(
                route, {"kind": "flagger.event", "canary": canary, "metadata": event}
            )
            return JSONResponse({"recorded": entry_id})
        verdict = await service.verdict(route)
        ok, problems = service.preflight_status(route)
        answer = flagger_answer(hook, verdict, ok, problems)
        await service.record(
            route,
            {
                "kind": f"flagger.{hook}",
                "canary": canary,
                "status": answer.status,
                "verdict": verdict.verdict,
                "epoch": verdict.epoch,
            },
        )
        return JSONResponse(answer.body, status_code=answer.status)

    return app


def build_service(
    redis_url: str,
    key_prefix: str,
    signing: SigningSettings,
    policy: Policy,
    preflight: Mapping[str, PreflightRule],
    certificates: Mapping[str, Path] | None = None,
) -> VerdictService:
    """The service from settings' parts: one Redis client, the breaker store for its reads.

    The key ring verifies both the route's latest command and preflight approvals,
    as the gateway does; the trusted public keys (``signing.public_keys``) verify
    Ed25519 approvals and the routes' certificates.
    """
    client = aioredis.Redis.from_url(redis_url, socket_timeout=3)
    # The store needs a signer to be built; this process only calls its reads.
    store = RedisBreakerStore(
        client, signer_from_settings(signing.active_key_id, signing.keys), key_prefix=key_prefix
    )
    return VerdictService(
        store=store,
        redis=client,
        key_prefix=key_prefix,
        policy=policy,
        verifier=verifier_from_settings(signing.keys),
        keys=trusted(signing),
        preflight=preflight,
        certificates=dict(certificates or {}),
    )
