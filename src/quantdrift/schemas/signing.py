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

Scores are signed the same way, with the same key ring, in a ``SignedScore``
envelope on the scores topic. Why sign rather than have the judge fold only the
scores its own process computed: scoring spreads over every worker whatever the
route, while judging is single-writer per route (scores are keyed by route), so a
score is usually judged by another worker than the one that computed it. Signing
keeps that split, lets replay and analysts check where a score came from, and
costs one HMAC per score. A score's MAC covers ``SCORE_DOMAIN`` followed by the
payload, so a signed score is never a valid command envelope, nor the reverse.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, NoReturn

from pydantic import Field

from quantdrift.errors import ConfigError, SchemaError, SignatureError, StaleCommand
from quantdrift.schemas.base import SCHEMA_VERSION, Message
from quantdrift.schemas.command import RouteCommand
from quantdrift.schemas.score import ScoreEvent

DEFAULT_MAX_AGE_S = 300.0
DEFAULT_MAX_SKEW_S = 30.0
# Domain separation: what a score's HMAC covers starts with this, a command's does not.
SCORE_DOMAIN = b"quantdrift.score.v1\n"
# A ScoreEvent is a few kB (metrics, short reasons). The bound is generous on
# purpose: a genuine score must never be refused for its size. It only caps what
# one record can make the judge parse.
MAX_SCORE_PAYLOAD = 1024 * 1024


class SignedCommand(Message):
    """The envelope on the control topic and in the route's Redis key."""

    schema_version: Literal[1] = SCHEMA_VERSION
    key_id: str
    signature: str
    payload: str

    def command(self) -> RouteCommand:
        """The command inside, *unverified*: for tools that display, never for obeying."""
        return RouteCommand.parse(self.payload)


class SignedScore(Message):
    """The envelope of a ScoreEvent on the scores topic; the MAC covers SCORE_DOMAIN + payload."""

    schema_version: Literal[1] = SCHEMA_VERSION
    key_id: str = Field(max_length=64)
    signature: str = Field(max_length=128)
    payload: str = Field(max_length=MAX_SCORE_PAYLOAD)


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

    def seal_score(self, score: ScoreEvent, now: float) -> bytes:
        """The SignedScore bytes for ``score``, stamped ``scored_at=now``: a scores record."""
        payload = score.model_copy(update={"scored_at": now}).dumps()
        envelope = SignedScore(
            key_id=self.key_id,
            signature=self.signature(SCORE_DOMAIN + payload),
            payload=payload.decode(),
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
        payload = self._signed_payload(envelope, "command")
        try:
            return RouteCommand.parse(payload)
        except SchemaError as exc:
            self.refuse("unreadable", f"signed payload is not a RouteCommand: {exc}", SchemaError)

    def open_score(self, raw: bytes | str, now: float, max_age_s: float) -> ScoreEvent:
        """A score the judge may fold: signed by a known key, and recent.

        ``max_age_s`` is the judge's pair-id dedupe window: an older score may be a
        replay that dedupe no longer catches, so it is refused (``stale_score``).
        Raises SchemaError for unreadable bytes, SignatureError otherwise; every
        refusal is counted under ``score_<reason>``.
        """
        try:
            envelope = SignedScore.parse(raw)
        except SchemaError as exc:
            try:
                ScoreEvent.parse(raw)
            except SchemaError as bare:
                self.refuse(
                    "score_unreadable",
                    f"not a signed score ({exc}), nor a ScoreEvent ({bare})",
                    SchemaError,
                )
            self.refuse("score_unsigned", "a bare ScoreEvent, not in a SignedScore envelope")
        payload = self._signed_payload(envelope, "score")
        try:
            score = ScoreEvent.parse(payload)
        except SchemaError as exc:
            self.refuse(
                "score_unreadable", f"signed payload is not a ScoreEvent: {exc}", SchemaError
            )
        if score.scored_at is None or score.scored_at < now - max_age_s:
            self.refuse(
                "score_stale",
                f"score {score.pair_id}: signed more than {max_age_s:g} s ago "
                "(outside the dedupe window, so it could be a replay)",
                StaleCommand,
            )
        if score.scored_at > now + self.max_skew_s:
            self.refuse(
                "score_future",
                f"score {score.pair_id}: signed {score.scored_at - now:.0f} s in the future",
                StaleCommand,
            )
        return score

    def _signed_payload(
        self, envelope: SignedCommand | SignedScore, what: Literal["command", "score"]
    ) -> bytes:
        """The envelope's payload bytes, once its MAC holds under a key of the ring.

        One check for both kinds; they differ only in what the MAC covers (a score's
        starts with ``SCORE_DOMAIN``) and in how refusals are counted (``unsigned``,
        ``unknown_key``, ``bad_signature``; ``score_`` before each for a score).
        """
        domain, reason = (b"", "") if what == "command" else (SCORE_DOMAIN, "score_")
        if not envelope.signature:
            self.refuse(f"{reason}unsigned", f"{what} has no signature")
        key = self.keys.get(envelope.key_id)
        if key is None:
            self.refuse(
                f"{reason}unknown_key", f"{what} signed by unknown key id {envelope.key_id!r}"
            )
        payload = envelope.payload.encode("utf-8", "surrogatepass")
        expected = hmac.new(key, domain + payload, hashlib.sha256).hexdigest()
        if not hmac.compare_digest(expected, envelope.signature):
            self.refuse(f"{reason}bad_signature", f"{what} signature does not match the payload")
        return payload

    def check(self, command: RouteCommand, last_epoch: int, now: float) -> None:
        """Raise StaleCommand unless ``command`` may apply after ``last_epoch`` at ``now``."""
        found = self.staleness(command, last_epoch, now)
        if found is not None:
            self.refuse(*found, StaleCommand)

    def staleness(
        self, command: RouteCommand, last_epoch: int, now: float
    ) -> tuple[str, str] | None:
        """Why ``command`` may not apply after ``last_epoch`` at ``now`` (a refusal reason
        and a message), or None. Pure: :meth:`check` counts and raises, a gateway's fence
        (``gateway/control/fence.py``) returns it as a refusal."""
        if command.epoch <= last_epoch:
            return "stale_epoch", (
                f"command {command.command_id}: epoch {command.epoch} "
                f"is not newer than {last_epoch}"
            )
        if command.issued_at > now + self.max_skew_s:
            return "future_issued_at", (
                f"command {command.command_id}: issued {command.issued_at - now:.0f} s "
                "in the future"
            )
        if command.issued_at < now - self.max_age_s and command.users_on_candidate:
            return "stale_issued_at", (
                f"command {command.command_id}: issued {now - command.issued_at:.0f} s ago "
                f"(window {self.max_age_s:g} s) and would put users on the candidate"
            )
        return None

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


def unverified_score(raw: bytes | str | dict[str, Any]) -> ScoreEvent:
    """The score on a scores-topic record, *unverified*: for tools that display or replay.

    Reads the SignedScore envelope, and a bare ScoreEvent too (archives written before
    scores were signed). The judge never uses this: it calls ``open_score``.
    """
    try:
        envelope = SignedScore.parse(raw)
    except SchemaError:
        return ScoreEvent.parse(raw)
    return ScoreEvent.parse(envelope.payload)


def _raw(secret: object) -> bytes:
    getter = getattr(secret, "get_secret_value", None)
    value = getter() if getter else secret
    return str(value).encode()
