"""The one MAC check behind ``open`` and ``open_score``: same steps, kind-named refusals."""

from __future__ import annotations

import hashlib
import hmac

import pytest

from quantdrift.errors import SignatureError
from quantdrift.schemas.signing import SCORE_DOMAIN, CommandVerifier, SignedCommand, SignedScore

KEY = b"signed-payload-test-key-32-bytes-long"
PAYLOAD = '{"any": "text, checked before it is parsed"}'


def mac(data: bytes) -> str:
    return hmac.new(KEY, data, hashlib.sha256).hexdigest()


def test_a_command_mac_covers_the_payload_and_a_score_mac_the_domain_too() -> None:
    v = CommandVerifier({"k1": KEY})
    command = SignedCommand(key_id="k1", signature=mac(PAYLOAD.encode()), payload=PAYLOAD)
    score = SignedScore(
        key_id="k1", signature=mac(SCORE_DOMAIN + PAYLOAD.encode()), payload=PAYLOAD
    )
    assert v._signed_payload(command, "command") == PAYLOAD.encode()
    assert v._signed_payload(score, "score") == PAYLOAD.encode()
    # Domain separation: each MAC is refused as the other kind.
    for envelope, kind in ((command, "score"), (score, "command")):
        with pytest.raises(SignatureError, match=f"{kind} signature does not match"):
            v._signed_payload(envelope, kind)  # type: ignore[arg-type]
    assert v.refused == {"bad_signature": 1, "score_bad_signature": 1}


@pytest.mark.parametrize(
    ("key_id", "signature", "reason", "message"),
    [
        ("k1", "", "unsigned", "has no signature"),
        ("k9", "00", "unknown_key", "signed by unknown key id 'k9'"),
        ("k1", "00", "bad_signature", "signature does not match the payload"),
    ],
)
@pytest.mark.parametrize(("kind", "prefix"), [("command", ""), ("score", "score_")])
def test_each_refusal_is_counted_under_its_kind(
    key_id: str, signature: str, reason: str, message: str, kind: str, prefix: str
) -> None:
    v = CommandVerifier({"k1": KEY})
    envelope = SignedCommand(key_id=key_id, signature=signature, payload=PAYLOAD)
    with pytest.raises(SignatureError, match=f"^{kind} {message}"):
        v._signed_payload(envelope, kind)  # type: ignore[arg-type]
    assert v.refused == {prefix + reason: 1}
