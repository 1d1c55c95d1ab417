"""HMAC-SHA256 signing of RouteCommands over a canonical encoding.

The canonical body is the command without ``signature`` and without null fields
(exactly what ``dumps`` puts on the wire), as JSON with sorted
keys and no spaces, so a gateway in any language can recompute it:
``hmac_sha256(key, json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False))``.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import NoReturn

from quantdrift.errors import SignatureError, StaleCommand
from quantdrift.schemas.command import RouteCommand


def canonical_body(command: RouteCommand) -> bytes:
    """The exact bytes that are signed: every field but ``signature``."""
    body = command.model_dump(mode="json", exclude={"signature"}, exclude_none=True)
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


@dataclass(frozen=True, slots=True)
class CommandSigner:
    """Signs with the active key; its id travels in the command so keys can rotate."""

    key_id: str
    key: bytes

    def sign(self, command: RouteCommand) -> RouteCommand:
        unsigned = command.model_copy(update={"key_id": self.key_id, "signature": ""})
        digest = hmac.new(self.key, canonical_body(unsigned), hashlib.sha256).hexdigest()
        return unsigned.model_copy(update={"signature": digest})


@dataclass(slots=True)
class CommandVerifier:
    """Accepts a command only if signed by a known key and newer than the last applied.

    Counts every refusal by reason: on-call wants to know someone is forging.
    """

    keys: Mapping[str, bytes]
    refused: dict[str, int] = field(default_factory=dict)

    def verify_signature(self, command: RouteCommand) -> None:
        if not command.signature:
            self._refuse("unsigned", f"command {command.command_id} has no signature")
        key = self.keys.get(command.key_id)
        if key is None:
            self._refuse(
                "unknown_key", f"command {command.command_id}: unknown key id {command.key_id!r}"
            )
        expected = hmac.new(key, canonical_body(command), hashlib.sha256).hexdigest()
        if not hmac.compare_digest(expected, command.signature):
            self._refuse("bad_signature", f"command {command.command_id}: signature does not match")

    def verify(self, command: RouteCommand, last_epoch: int) -> None:
        """Raise SignatureError or StaleCommand; return None when the command may apply."""
        self.verify_signature(command)
        if command.epoch <= last_epoch:
            self.refused["stale_epoch"] = self.refused.get("stale_epoch", 0) + 1
            raise StaleCommand(
                f"command {command.command_id}: epoch {command.epoch} "
                f"is not newer than {last_epoch}"
            )

    def _refuse(self, reason: str, message: str) -> NoReturn:
        self.refused[reason] = self.refused.get(reason, 0) + 1
        raise SignatureError(message)


def signer_from_settings(active_key_id: str, keys: Mapping[str, object]) -> CommandSigner:
    """Build the signer from SigningSettings-like values (SecretStr or str)."""
    secret = keys.get(active_key_id)
    if secret is None:
        from quantdrift.errors import ConfigError

        raise ConfigError(f"signing.active_key_id {active_key_id!r} is not in signing.keys")
    return CommandSigner(active_key_id, _raw(secret))


def verifier_from_settings(keys: Mapping[str, object]) -> CommandVerifier:
    return CommandVerifier({k: _raw(v) for k, v in keys.items()})


def _raw(secret: object) -> bytes:
    getter = getattr(secret, "get_secret_value", None)
    value = getter() if getter else secret
    return str(value).encode()
