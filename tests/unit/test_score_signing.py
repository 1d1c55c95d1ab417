"""Score signing: the judge folds only scores a worker's key signed, recently.

The end-to-end check (a forged score on the real topic moves no route) is in
tests/faults/test_fault_forged_score.py; these pin the envelope and every refusal.
"""

from __future__ import annotations

import hashlib
import hmac
import json

import pytest

from quantdrift.errors import SchemaError, SignatureError, StaleCommand
from quantdrift.schemas import CommandSigner, CommandVerifier, Metrics, ScoreEvent
from quantdrift.schemas.signing import SCORE_DOMAIN, unverified_score
from quantdrift.streams.handlers import RawRecord, parse_score

KEY = b"score-test-key-of-at-least-32-bytes"
SIGNER = CommandSigner("k1", KEY)
NOW = 1_700_000_000.0
WINDOW = 3600.0


def score(**overrides: object) -> ScoreEvent:
    fields: dict[str, object] = {
        "pair_id": "p-1",
        "route": "cs-agent/int4",
        "kind": "shadow",
        "ts": NOW - 1,
        "metrics": Metrics(cosine=0.42),
        "verdict": "drift",
        "reasons": ["cosine 0.42 < 0.80"],
    }
    fields.update(overrides)
    return ScoreEvent.model_validate(fields)


def verifier() -> CommandVerifier:
    return CommandVerifier({"k1": KEY})


def test_sealed_score_opens_with_its_scored_at() -> None:
    v = verifier()
    opened = v.open_score(SIGNER.seal_score(score(), NOW), NOW + 1, WINDOW)
    assert opened == score(scored_at=NOW)
    assert v.refused == {}


def test_mac_covers_the_score_domain_and_the_payload_bytes() -> None:
    envelope = json.loads(SIGNER.seal_score(score(), NOW))
    payload = envelope["payload"].encode()
    mac = hmac.new(KEY, SCORE_DOMAIN + payload, hashlib.sha256).hexdigest()
    assert envelope["signature"] == mac


def forged(raw: bytes, **payload_changes: object) -> bytes:
    envelope = json.loads(raw)
    payload = json.loads(envelope["payload"])
    payload.update(payload_changes)
    envelope["payload"] = json.dumps(payload)
    return json.dumps(envelope).encode()


GENUINE = SIGNER.seal_score(score(), NOW)
GENUINE_OK = SIGNER.seal_score(score(verdict="ok"), NOW)
GUESSED_KEY = CommandSigner("k1", b"g" * 32).seal_score(score(), NOW)
UNKNOWN_KEY = CommandSigner("attacker", KEY).seal_score(score(), NOW)
NO_SIGNATURE = json.dumps({**json.loads(GENUINE), "signature": ""}).encode()


@pytest.mark.parametrize(
    ("raw", "reason", "error"),
    [
        # what anyone with write access to the topic could produce before scores were signed
        (score().dumps(), "score_unsigned", SignatureError),
        (NO_SIGNATURE, "score_unsigned", SignatureError),
        (forged(GENUINE_OK, verdict="drift"), "score_bad_signature", SignatureError),
        (forged(GENUINE, route="other/int4"), "score_bad_signature", SignatureError),
        (GUESSED_KEY, "score_bad_signature", SignatureError),
        (UNKNOWN_KEY, "score_unknown_key", SignatureError),
        (SIGNER.seal_score(score(), NOW - WINDOW - 1), "score_stale", StaleCommand),
        (SIGNER.seal_score(score(), NOW + 3600), "score_future", StaleCommand),
        (b"\xff not json", "score_unreadable", SchemaError),
    ],
)
def test_forged_stale_and_unsigned_scores_are_refused_and_counted(
    raw: bytes, reason: str, error: type[Exception]
) -> None:
    v = verifier()
    with pytest.raises(error):
        v.open_score(raw, NOW, WINDOW)
    assert v.refused == {reason: 1}


def test_a_signed_command_is_not_a_signed_score_nor_the_reverse() -> None:
    """Domain separation: the same key ring signs both, neither passes for the other."""
    from quantdrift.schemas import RouteCommand

    command = RouteCommand(
        command_id="c", route="r", action="rollback", target="reference", epoch=1, issued_at=NOW
    )
    sealed_command = SIGNER.seal(command)
    # A command envelope's payload is no ScoreEvent, and its MAC lacks the score domain.
    envelope = json.loads(sealed_command)
    envelope["payload"] = score(scored_at=NOW).dumps().decode()
    envelope["signature"] = SIGNER.signature(envelope["payload"].encode())
    with pytest.raises(SignatureError):
        verifier().open_score(json.dumps(envelope).encode(), NOW, WINDOW)
    with pytest.raises(SignatureError):
        verifier().open(SIGNER.seal_score(score(), NOW))


@pytest.mark.parametrize(
    "route", ["r" * 201, "", "a route with spaces", "route\r\nX-Header: 1", "路由"]
)
def test_route_field_is_bounded(route: str) -> None:
    with pytest.raises(SchemaError, match="route"):
        ScoreEvent.parse({**score().model_dump(mode="json"), "route": route})


def test_judge_dead_letters_a_forged_score_with_its_reason() -> None:
    rec = RawRecord(score().dumps(), b"cs-agent/int4", "t.scores", 0, 7)
    v = verifier()
    letter = parse_score(rec, NOW, v, WINDOW)
    assert not isinstance(letter, ScoreEvent)
    assert letter.original() == score().dumps() and letter.offset == 7
    assert "bare ScoreEvent" in letter.error
    assert v.refused == {"score_unsigned": 1}


def test_judge_refuses_a_signed_score_keyed_to_another_route() -> None:
    rec = RawRecord(SIGNER.seal_score(score(), NOW), b"other/int4", "t.scores", 0, 8)
    letter = parse_score(rec, NOW, verifier(), WINDOW)
    assert not isinstance(letter, ScoreEvent) and "differs from route" in letter.error


def test_display_tools_read_signed_and_bare_scores() -> None:
    assert unverified_score(SIGNER.seal_score(score(), NOW)) == score(scored_at=NOW)
    assert unverified_score(score().dumps()) == score()
