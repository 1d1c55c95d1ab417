"""Who may call the gateway, for which routes, with which privileges.

Keys are stored as their sha256 (hex), in the config's ``auth.keys`` or in
the environment (``QUANTDRIFT_GATEWAY__API_KEYS``, read by the CLI), never in
clear: a leaked config file does not leak a key. A caller sends
``Authorization: Bearer <key>`` (what the OpenAI SDKs send) and becomes the
``Principal`` of the matching entry. ``high_precision`` is a privilege: a key
without it asking for the reference gets a 403, since the reference costs
several times the candidate and a free upgrade is the first thing a caller
would try.

Without an ``auth`` section the gateway is open (every route, every
preference) and says so at startup: the existing examples and tests keep
working, and nobody runs it open by accident without a warning in the log.

Examples
--------
>>> import hashlib
>>> from quantdrift.gateway.gateway_config import ApiKey, AuthConfig
>>> digest = hashlib.sha256(b"sk-team-a").hexdigest()
>>> auth = Authenticator(AuthConfig(keys=[ApiKey(name="a", sha256=digest, routes=["r1"])]))
>>> auth.principal("Bearer sk-team-a").name, auth.principal("Bearer nope")
('a', None)
>>> auth.principal("Bearer sk-team-a").may_use("r2")
False
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass

from quantdrift.gateway.gateway_config import AuthConfig


@dataclass(frozen=True, slots=True)
class Principal:
    """An authenticated caller (or ``OPEN`` when the gateway has no keys)."""

    name: str
    routes: frozenset[str]
    high_precision: bool

    def may_use(self, route: str) -> bool:
        return "*" in self.routes or route in self.routes


OPEN = Principal("open", frozenset({"*"}), True)


def sha256_hex(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8", "surrogatepass")).hexdigest()


def bearer(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer ...`` header, else None."""
    if not authorization:
        return None
    scheme, _, token = authorization.partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


class Authenticator:
    """Maps a presented key to its Principal; constant-time comparison of digests."""

    def __init__(self, config: AuthConfig | None) -> None:
        self.enabled = config is not None and bool(config.keys)
        self._keys = {
            k.sha256: Principal(k.name, frozenset(k.routes), k.high_precision)
            for k in (config.keys if config else ())
        }
        self._admin = config.admin_token_sha256 if config else None

    def principal(self, authorization: str | None) -> Principal | None:
        """The caller, OPEN when auth is off, None for a missing or unknown key."""
        if not self.enabled:
            return OPEN
        token = bearer(authorization)
        if token is None:
            return None
        digest = sha256_hex(token)
        for stored, who in self._keys.items():
            if hmac.compare_digest(stored, digest):
                return who
        return None

    @property
    def admin_protected(self) -> bool:
        return self._admin is not None

    def admin_ok(self, authorization: str | None) -> bool:
        """``/metrics`` and ``/health``: open unless ``admin_token_sha256`` is set."""
        if self._admin is None:
            return True
        token = bearer(authorization)
        return token is not None and hmac.compare_digest(self._admin, sha256_hex(token))
