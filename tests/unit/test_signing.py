"""Command signing: the envelope over exact bytes, what a gateway refuses, and the counts."""

from __future__ import annotations

import hashlib
import hmac
import json

import pytest

from quantdrift.errors import SchemaError, SignatureError, StaleCommand
from quantdrift.schemas import CommandSigner, CommandVerifier, RouteCommand, SignedCommand

KEY = b"k1-secret-key-of-at-least-32-bytes"
SIGNER = CommandSigner("k1", KEY)
NOW = 1_700_000_000.25


def command(epoch: int = 3, **overrides: object) -> RouteCommand:
    fields: dict[str, object] = {
        "command_id": f"cmd-{epoch}",
        "route": "cs-agent/int4",
        "action": "rollback",
        "target": "reference",
        "target_precision": "bf16",
        "epoch": epoch,
        "state": "open",
        "reason": "consecutive: 3 failing pairs",
        "evidence": {"cosine": 0.71, "cooldown_s": 60.0, "p": 1e-07, "note": "相似度下降"},
        "issued_at": NOW,
    }
    fields.update(overrides)
    return RouteCommand.model_validate(fields)


def verifier(**kwargs: float) -> CommandVerifier:
    return CommandVerifier({"k1": KEY}, **kwargs)


def reseal(raw: bytes, **changes: object) -> bytes:
    """The envelope with some of its fields replaced (forgeries)."""
    data = json.loads(raw)
    data.update(changes)
    return json.dumps(data).encode()


def test_sealed_command_opens_and_checks() -> None:
    v = verifier()
    opened = v.open(SIGNER.seal(command()))
    assert opened == command()
    v.check(opened, last_epoch=0, now=NOW)
    v.check(opened, last_epoch=2, now=NOW)
    assert v.refused == {}


def test_signature_is_over_the_payload_bytes_as_documented() -> None:
    """The recipe in the README: HMAC-SHA256 of the payload string's UTF-8 bytes."""
    envelope = json.loads(SIGNER.seal(command()))
    assert envelope["key_id"] == "k1" and envelope["schema_version"] == 1
    expected = hmac.new(KEY, envelope["payload"].encode("utf-8"), hashlib.sha256).hexdigest()
    assert envelope["signature"] == expected
    # The payload keeps Python's float spelling; no verifier re-serialises it.
    assert '"cooldown_s":60.0' in envelope["payload"]


def test_reserialised_envelope_still_verifies() -> None:
    """Any JSON tool may re-encode the envelope (spaces, escapes): the payload string survives."""
    raw = SIGNER.seal(command())
    rewritten = json.dumps(json.loads(raw), indent=2, ensure_ascii=True).encode()
    assert rewritten != raw
    assert verifier().open(rewritten) == command()


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("epoch", 99),
        ("target", "candidate"),
        ("route", "other/int4"),
        ("action", "restore"),
        ("evidence", {"cosine": 0.99}),
    ],
)
def test_tampered_payload_is_refused(field: str, value: object) -> None:
    raw = SIGNER.seal(command())
    payload = json.loads(json.loads(raw)["payload"])
    payload[field] = value
    v = verifier()
    with pytest.raises(SignatureError, match="does not match"):
        v.open(reseal(raw, payload=json.dumps(payload)))
    assert v.refused == {"bad_signature": 1}


def test_wrong_key_is_refused() -> None:
    v = verifier()
    with pytest.raises(SignatureError):
        v.open(CommandSigner("k1", b"not-the-key").seal(command()))
    assert v.refused == {"bad_signature": 1}


def test_unknown_key_id_is_refused() -> None:
    v = verifier()
    with pytest.raises(SignatureError, match="unknown key id"):
        v.open(CommandSigner("k9", KEY).seal(command()))
    assert v.refused == {"unknown_key": 1}


def test_missing_signature_is_refused() -> None:
    v = verifier()
    with pytest.raises(SignatureError, match="no signature"):
        v.open(reseal(SIGNER.seal(command()), signature=""))
    assert v.refused == {"unsigned": 1}


@pytest.mark.parametrize(
    "raw",
    [
        b"not json",
        b"{}",
        command().dumps(),  # a bare command, no envelope
        SignedCommand(key_id="k1", signature="00", payload="[]").dumps(),
    ],
)
def test_unreadable_is_a_schema_error(raw: bytes) -> None:
    v = verifier()
    with pytest.raises((SchemaError, SignatureError)):
        v.open(raw)
    assert sum(v.refused.values()) == 1


def test_signed_payload_that_is_not_a_command_is_unreadable() -> None:
    payload = b'{"route": "r"}'
    raw = SignedCommand(
        key_id="k1", signature=SIGNER.signature(payload), payload=payload.decode()
    ).dumps()
    v = verifier()
    with pytest.raises(SchemaError):
        v.open(raw)
    assert v.refused == {"unreadable": 1}


@pytest.mark.parametrize("last_epoch", [3, 4, 100])
def test_epoch_not_newer_is_stale(last_epoch: int) -> None:
    v = verifier()
    with pytest.raises(StaleCommand):
        v.check(command(epoch=3), last_epoch=last_epoch, now=NOW)
    assert v.refused == {"stale_epoch": 1}


def test_stale_is_a_signature_error_for_callers_that_catch_one_type() -> None:
    assert issubclass(StaleCommand, SignatureError)


def test_old_restore_is_refused_old_rollback_is_not() -> None:
    """A replayed old restore could put users back on a broken candidate: refused.
    An old rollback only moves users to the reference, so a gateway that lost its
    state may still follow it (a fresh command with a newer epoch wins later)."""
    v = verifier(max_age_s=300)
    later = NOW + 301
    with pytest.raises(StaleCommand, match="would put users on the candidate"):
        v.check(command(action="restore", target="candidate"), last_epoch=0, now=later)
    with pytest.raises(StaleCommand):
        v.check(command(action="canary", percent=10.0), last_epoch=0, now=later)
    v.check(command(action="rollback"), last_epoch=0, now=later)
    v.check(command(action="canary", percent=0.0), last_epoch=0, now=later)
    assert v.refused == {"stale_issued_at": 2}


def test_command_from_the_future_is_refused() -> None:
    v = verifier(max_skew_s=30)
    with pytest.raises(StaleCommand, match="future"):
        v.check(command(), last_epoch=0, now=NOW - 31)
    v.check(command(), last_epoch=0, now=NOW - 29)
    assert v.refused == {"future_issued_at": 1}


def test_refusals_are_counted_by_reason() -> None:
    v = verifier()
    for raw in (
        CommandSigner("k1", b"x").seal(command()),
        CommandSigner("zz", KEY).seal(command()),
        reseal(SIGNER.seal(command()), signature=""),
    ):
        with pytest.raises(SignatureError):
            v.open(raw)
    good = v.open(SIGNER.seal(command(epoch=3)))
    for last in (3, 5):
        with pytest.raises(StaleCommand):
            v.check(good, last_epoch=last, now=NOW)
    v.check(good, last_epoch=2, now=NOW)
    assert v.refused == {"bad_signature": 1, "unknown_key": 1, "unsigned": 1, "stale_epoch": 2}


def test_key_rotation_accepts_old_and_new_keys() -> None:
    v = CommandVerifier({"2024": b"old-key", "2025": b"new-key"})
    assert v.open(CommandSigner("2024", b"old-key").seal(command(epoch=1))).epoch == 1
    assert v.open(CommandSigner("2025", b"new-key").seal(command(epoch=2))).epoch == 2
    with pytest.raises(SignatureError):
        v.open(CommandSigner("2025", b"old-key").seal(command(epoch=3)))
    assert v.refused == {"bad_signature": 1}


def test_retired_key_is_refused_after_rotation() -> None:
    v = CommandVerifier({"2025": b"new-key"})
    with pytest.raises(SignatureError, match="unknown key id"):
        v.open(CommandSigner("2024", b"old-key").seal(command()))
