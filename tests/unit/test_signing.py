"""Command signing: what a gateway accepts, what it refuses, and how refusals are counted."""

from __future__ import annotations

import hashlib
import hmac
import json

import pytest

from quantdrift.errors import SignatureError, StaleCommand
from quantdrift.schemas import CommandSigner, CommandVerifier, RouteCommand, canonical_body

KEY = b"k1-secret"
SIGNER = CommandSigner("k1", KEY)


def command(epoch: int = 3, **overrides: object) -> RouteCommand:
    fields: dict[str, object] = {
        "command_id": f"cmd-{epoch}",
        "route": "cs-agent/int4",
        "action": "rollback",
        "target_precision": "bf16",
        "epoch": epoch,
        "state": "open",
        "reason": "consecutive: 3 failing pairs",
        "evidence": {"cosine": 0.71, "note": "相似度下降"},
        "issued_at": 1_700_000_000.25,
    }
    fields.update(overrides)
    return RouteCommand.model_validate(fields)


def verifier() -> CommandVerifier:
    return CommandVerifier({"k1": KEY})


def test_good_signature_verifies() -> None:
    v = verifier()
    signed = SIGNER.sign(command())
    v.verify(signed, last_epoch=0)
    v.verify(signed, last_epoch=2)
    assert signed.key_id == "k1" and len(signed.signature) == 64
    assert v.refused == {}


def test_signature_survives_the_wire() -> None:
    """What the gateway parses from Kafka or Redis bytes still verifies."""
    signed = SIGNER.sign(command(percent=None))
    parsed = RouteCommand.parse(signed.dumps())
    verifier().verify(parsed, last_epoch=0)
    assert canonical_body(parsed) == canonical_body(signed)


def test_canonical_body_is_the_documented_json() -> None:
    """Another language recomputes the HMAC from the JSON it received, by the documented recipe."""
    signed = SIGNER.sign(command(percent=None))
    body = json.loads(signed.dumps())
    del body["signature"]
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    expected = hmac.new(KEY, text.encode(), hashlib.sha256).hexdigest()
    assert signed.signature == expected


@pytest.mark.parametrize(
    "field, value",
    [
        ("target_precision", "int4"),
        ("action", "restore"),
        ("epoch", 99),
        ("route", "other/int4"),
        ("locked", True),
        ("evidence", {"cosine": 0.99}),
        ("key_id", "k2"),
    ],
)
def test_tampered_field_is_refused(field: str, value: object) -> None:
    v = CommandVerifier({"k1": KEY, "k2": KEY})  # k2 known, so key_id tampering hits the HMAC
    tampered = SIGNER.sign(command()).model_copy(update={field: value})
    with pytest.raises(SignatureError) as info:
        v.verify(tampered, last_epoch=0)
    assert type(info.value) is SignatureError
    assert v.refused == {"bad_signature": 1}


def test_wrong_key_is_refused() -> None:
    v = verifier()
    forged = CommandSigner("k1", b"not-the-key").sign(command())
    with pytest.raises(SignatureError):
        v.verify(forged, last_epoch=0)
    assert v.refused == {"bad_signature": 1}


def test_unknown_key_id_is_refused() -> None:
    v = verifier()
    with pytest.raises(SignatureError, match="unknown key id"):
        v.verify(CommandSigner("k9", KEY).sign(command()), last_epoch=0)
    assert v.refused == {"unknown_key": 1}


@pytest.mark.parametrize("key_id", ["", "k1"])
def test_missing_signature_is_refused(key_id: str) -> None:
    v = verifier()
    with pytest.raises(SignatureError, match="no signature"):
        v.verify(command(key_id=key_id), last_epoch=0)
    assert v.refused == {"unsigned": 1}


@pytest.mark.parametrize("last_epoch", [3, 4, 10])
def test_epoch_not_newer_is_stale(last_epoch: int) -> None:
    v = verifier()
    with pytest.raises(StaleCommand):
        v.verify(SIGNER.sign(command(epoch=3)), last_epoch=last_epoch)
    assert v.refused == {"stale_epoch": 1}


def test_stale_is_a_signature_error_for_callers_that_catch_one_type() -> None:
    assert issubclass(StaleCommand, SignatureError)


def test_forged_and_stale_reports_forged() -> None:
    """The signature is checked first: a forged old command counts as forged."""
    v = verifier()
    forged = CommandSigner("k1", b"nope").sign(command(epoch=1))
    with pytest.raises(SignatureError) as info:
        v.verify(forged, last_epoch=5)
    assert type(info.value) is SignatureError
    assert v.refused == {"bad_signature": 1}


def test_refusals_are_counted_by_reason() -> None:
    v = verifier()
    good = SIGNER.sign(command(epoch=3))
    attempts = [
        (good.model_copy(update={"target_precision": "int2"}), 0),
        (good.model_copy(update={"epoch": 4}), 0),
        (CommandSigner("k1", b"x").sign(command()), 0),
        (CommandSigner("zz", KEY).sign(command()), 0),
        (command(), 0),
        (good, 3),
        (good, 7),
    ]
    for cmd, last in attempts:
        with pytest.raises(SignatureError):
            v.verify(cmd, last_epoch=last)
    v.verify(good, last_epoch=2)
    assert v.refused == {"bad_signature": 3, "unknown_key": 1, "unsigned": 1, "stale_epoch": 2}


def test_key_rotation_accepts_old_and_new_keys() -> None:
    old, new = CommandSigner("2024", b"old-key"), CommandSigner("2025", b"new-key")
    v = CommandVerifier({"2024": b"old-key", "2025": b"new-key"})
    v.verify(old.sign(command(epoch=1)), last_epoch=0)
    v.verify(new.sign(command(epoch=2)), last_epoch=1)
    # A command claiming the new id but signed with the old key is still refused.
    mixed = CommandSigner("2025", b"old-key").sign(command(epoch=3))
    with pytest.raises(SignatureError):
        v.verify(mixed, last_epoch=2)
    assert v.refused == {"bad_signature": 1}


def test_retired_key_is_refused_after_rotation() -> None:
    v = CommandVerifier({"2025": b"new-key"})
    with pytest.raises(SignatureError):
        v.verify(CommandSigner("2024", b"old-key").sign(command()), last_epoch=0)
    assert v.refused == {"unknown_key": 1}
