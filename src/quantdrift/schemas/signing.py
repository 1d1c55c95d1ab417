"""HMAC-SHA256 over the exact bytes that travel, in a ``SignedCommand`` envelope.

A command is never re-serialised to be verified: the breaker writes the command
as JSON text once, signs those UTF-8 bytes, and ships text and signature side by
side. On the control topic and in the Redis backstop the value is the same
envelope::

    {"schema_version": 1, "key_id": "k1", "signature": "<hex>", "payload": "<command JSON>"}

Any language verifies it the same way: parse the envelope, take ``payload`` as
a string, HMAC-SHA256 its UTF-8 bytes with ``keys[key_id]``, compare in constant
time, and only then parse ``payload``. (Re-serialising JSON is what broke the
old recipe: Python writes ``60.0`` where JavaScript and Go write ``60``.)

A verified command is applied only if its epoch is newer than the one applied
for the route and its ``issued_at`` is within the freshness window. A stale
command may still move users *to the reference* (a replay cannot make a route
less safe), never back onto the candidate.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal, NoReturn

from quantdrift.errors import ConfigError, SchemaError, SignatureError, StaleCommand
from quantdrift.schemas.base import SCHEMA_VERSION, Message
from quantdrift.schemas.command import RouteCommand

DEFAULT_MAX_AGE_S = 300.0
DEFAULT_MAX_SKEW_S = 30.0


class SignedCommand(Message):
    """The envelope on the control topic and in the route's Redis key."""

    schema_version: Literal[1] = SCHEMA_VERSION
    key_id: str
    signature: str
    payload: str

    def command(self) -> RouteCommand:
        """The command inside, *unverified*: for tools that display, never for obeying."""
        return RouteCommand.parse(self.payload)


def command_bytes(command: RouteCommand) -> bytes:
    """The command as JSON, once: these are the bytes that are signed and shipped."""
    return command.dumps()


@dataclass(frozen=True, slots=True)
class CommandSigner:
    """Signs with the active key; its id travels in the envelope so keys can rotate."""

    key_id: str
    key: bytes

    def signature(self, payload: bytes) -> str:
        return hmac.new(self.key, payload, hashlib.sha256).hexdigest()

    def seal(self, command: RouteCommand) -> bytes:
        """The envelope bytes for ``command``: what goes to Kafka and Redis."""
        payload = command_bytes(command)
        envelope = SignedCommand(
            key_id=self.key_id, signature=self.signature(payload), payload=payload.decode()
        )
        return envelope.dumps()


@dataclass(slots=True)
class CommandVerifier:
    """Opens envelopes signed by a known key; fences epochs and ``issued_at``.

    Counts every refusal by reason: on-call wants to know someone is forging, and
    a gateway that cannot map a command says so (``unmappable_target``).
    """

    keys: Mapping[str, bytes]
    max_age_s: float = DEFAULT_MAX_AGE_S
    max_skew_s: float = DEFAULT_MAX_SKEW_S
    refused: dict[str, int] = field(default_factory=dict)

    def open(self, raw: bytes | str) -> RouteCommand:
        """Verify the envelope's signature over its payload bytes, then parse the payload.

        Raises SchemaError for unreadable bytes and SignatureError for a bad signature.
        """
        try:
            envelope = SignedCommand.parse(raw)
        except SchemaError as exc:
            self.refuse("unreadable", f"not a signed command: {exc}", SchemaError)
        if not envelope.signature:
            self.refuse("unsigned", "command has no signature")
        key = self.keys.get(envelope.key_id)
        if key is None:
            self.refuse("unknown_key", f"unknown key id {envelope.key_id!r}")
        payload = envelope.payload.encode("utf-8", "surrogatepass")
        expected = hmac.new(key, payload, hashlib.sha256).hexdigest()
        if not hmac.compare_digest(expected, envelope.signature):
            self.refuse("bad_signature", "signature does not match the payload")
        try:
            return RouteCommand.parse(payload)
        except SchemaError as exc:
            self.refuse("unreadable", f"signed payload is not a RouteCommand: {exc}", SchemaError)

    def check(self, command: RouteCommand, last_epoch: int, now: float) -> None:
        """Raise StaleCommand unless ``command`` may apply after ``last_epoch`` at ``now``."""
        if command.epoch <= last_epoch:
            self.refuse(
                "stale_epoch",
                f"command {command.command_id}: epoch {command.epoch} "
                f"is not newer than {last_epoch}",
                StaleCommand,
            )
        if command.issued_at > now + self.max_skew_s:
            self.refuse(
                "future_issued_at",
                f"command {command.command_id}: issued {command.issued_at - now:.0f} s "
                "in the future",
                StaleCommand,
            )
        if command.issued_at < now - self.max_age_s and command.users_on_candidate:
            self.refuse(
                "stale_issued_at",
                f"command {command.command_id}: issued {now - command.issued_at:.0f} s ago "
                f"(window {self.max_age_s:g} s) and would put users on the candidate",
                StaleCommand,
            )

    def refuse(self, reason: str, message: str, kind: type[Exception] = SignatureError) -> NoReturn:
        self.refused[reason] = self.refused.get(reason, 0) + 1
        raise kind(message)


def signer_from_settings(active_key_id: str, keys: Mapping[str, object]) -> CommandSigner:
    """Build the signer from SigningSettings-like values (SecretStr or str)."""
    secret = keys.get(active_key_id)
    if secret is None:
        raise ConfigError(f"signing.active_key_id {active_key_id!r} is not in signing.keys")
    return CommandSigner(active_key_id, _raw(secret))


def verifier_from_settings(
    keys: Mapping[str, object],
    max_age_s: float = DEFAULT_MAX_AGE_S,
    max_skew_s: float = DEFAULT_MAX_SKEW_S,
) -> CommandVerifier:
    return CommandVerifier({k: _raw(v) for k, v in keys.items()}, max_age_s, max_skew_s)


def unverified_command(raw: bytes | str) -> RouteCommand:
    """The command inside an envelope, without verifying (status pages, replay, tests)."""
    return SignedCommand.parse(raw).command()


def _raw(secret: object) -> bytes:
    getter = getattr(secret, "get_secret_value", None)
    value = getter() if getter else secret
    return str(value).encode()
