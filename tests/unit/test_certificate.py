"""The certificate format: what it binds, and what verification refuses (pure).

Across the seams (a real preflight run, ``preflight keygen`` and ``preflight sign``,
``quantdrift replay`` for live evidence, the CLI and the Node.js verifier):
tests/integration/test_preflight_certificate.py.
"""

from __future__ import annotations

import hashlib
import hmac
import json

from quantdrift.preflight.report import Item, build_report, report_bytes
from quantdrift.schemas import certificate as cert
from quantdrift.schemas import ed25519
from quantdrift.schemas.signoff import approve, verify

RING = {"ops": b"ops-key-of-at-least-32-bytes-long!!"}
ISSUER, ALICE, BOB = ed25519.generate(), ed25519.generate(), ed25519.generate()
PUBLIC = {ed25519.key_id(k.public_key()): k.public_key() for k in (ISSUER, ALICE, BOB)}
CKPT = {"name": "m", "format": "safetensors", "bits": 4.0, "group_size": 128, "files": {"a": "1"}}


def _report(verdict_item: str = "pass") -> bytes:
    subj = {"route": "r/int4", "checkpoint": CKPT, "engines": {"candidate": {"engine": "vllm"}}}
    return report_bytes(build_report([Item("probes", "P", verdict_item)], subject=subj))


def _issue(live: str | None = None, approvals: int = 2, hmac_bob: bool = False) -> bytes:
    raw = _report()
    signed = [approve(raw, "alice", "", ALICE, 1.0)]
    signed.append(approve(raw, "bob", "ops", RING["ops"] if hmac_bob else BOB, 2.0))
    env = cert.issue(raw, signed[:approvals], required=2, distinct_keys=False, key=ISSUER,
                     issued_at=5.0, live_text=live)  # fmt: skip
    return json.dumps(env).encode()


def test_a_certificate_verifies_with_public_keys_alone() -> None:
    c = cert.check(_issue(live='{"pairs": 3}'), PUBLIC)
    assert c.ok and c.signers == ["alice", "bob"] and c.problems == []
    assert c.key_id == ed25519.key_id(ISSUER.public_key()) and c.signature_ok
    assert c.payload is not None and c.payload["model"] == CKPT
    assert c.payload["live"]["text"] == '{"pairs": 3}'
    # The HMAC ring beside the public keys changes nothing (the CLI passes both).
    assert cert.check(_issue(), {**RING, **PUBLIC}).ok


def test_what_verification_refuses() -> None:
    good = _issue()
    issuer = ed25519.key_id(ISSUER.public_key())
    others = {k: v for k, v in PUBLIC.items() if k != issuer}
    assert cert.check(good, others).problems == [
        f"signed by {issuer}, which is not a trusted public key (give its public key)"
    ]
    edited = cert.check(good.replace(b"r/int4", b"r/int8"), PUBLIC)
    assert edited.problems == ["bad signature: the certificate was altered or forged"]
    assert not edited.signature_ok
    assert cert.check(b"{}", PUBLIC).problems == ["not a quantdrift certificate"]
    one = cert.check(_issue(approvals=1), PUBLIC)
    assert one.problems == ["preflight: 1 distinct signers with a valid approval, 2 needed"]
    assert one.signature_ok and not one.ok
    # An approval anyone could check only with the ring is not counted, and said so.
    mixed = cert.check(_issue(hmac_bob=True), {**RING, **PUBLIC})
    assert mixed.problems == [
        "preflight: bob: an HMAC approval (key 'ops'); a certificate needs Ed25519 approvals",
        "preflight: 1 distinct signers with a valid approval, 2 needed",
    ]


def test_a_version_1_certificate_is_refused_with_why() -> None:
    """v1 was HMAC over the payload with a ring key: refused, never checked with the ring."""
    payload = json.dumps({"kind": cert.V1_KIND})
    mac = hmac.new(RING["ops"], b"quantdrift.certificate.v1\n" + payload.encode(), hashlib.sha256)
    v1 = {"schema_version": 1, "kind": cert.V1_KIND, "key_id": "ops",
          "signature": mac.hexdigest(), "payload": payload}  # fmt: skip
    c = cert.check(json.dumps(v1).encode(), {**RING, **PUBLIC})
    assert not c.ok and c.problems == [cert.V1_REFUSED] and "re-issue" in c.problems[0]


def test_ed25519_and_hmac_approvals_verify_side_by_side() -> None:
    """Reports signed with the ring keep their sign-off; an Ed25519 approval needs its
    public key, and a record cannot claim one algorithm under the other's key."""
    raw = _report()
    a = approve(raw, "alice", "", ALICE, 1.0)
    b = approve(raw, "bob", "ops", RING["ops"], 2.0)
    assert a["alg"] == "ed25519" and a["key_id"] == ed25519.key_id(ALICE.public_key())
    assert verify(raw, [a, b], {**RING, **PUBLIC}).ok
    assert verify(raw, [a, b], RING).problems == [
        f"alice: unknown key id {a['key_id']!r}",
        "1 distinct signers with a valid approval, 2 needed",
    ]
    relabelled = {**b, "alg": "ed25519"}
    assert not verify(raw, [a, relabelled], {**RING, **PUBLIC}).ok
    forged = {**a, "by": "mallory"}
    assert verify(raw, [forged, b], {**RING, **PUBLIC}).problems[0] == "mallory: bad signature"


def test_live_rows_read_route_status_and_replay() -> None:
    status = [
        {"route": "r/int4", "pairs_seen": 40, "readiness": "armed", "reason": "closed",
         "slices": [{"slice": "language=en", "pairs": 37, "min_pairs": 20, "status": "testing",
                     "tests": {"lexical": {"pairs": 37, "mean_x": 0.1, "log_r_max": 0.0}}},
                    {"slice": "language=zh", "pairs": 3, "min_pairs": 20,
                     "status": "insufficient_data", "tests": {}}]},
    ]  # fmt: skip
    rows = cert.live_rows(json.dumps(status))
    assert [(r["slice"], r["pairs"], r["status"], r["e_value"]) for r in rows] == [
        ("all", 40, "armed", None),
        ("language=en", 37, "testing", 1.0),
        ("language=zh", 3, "insufficient_data", None),
    ]
    replay = {"routes": {"lab/int2": {"shadow_pairs": 9, "trips": [{"rule": "tolerance"}]}}}
    assert cert.live_rows(json.dumps(replay)) == [
        {"route": "lab/int2", "slice": "all", "pairs": 9, "status": "tripped",
         "e_value": None, "detail": "1 trips (tolerance)"}
    ]  # fmt: skip
    assert cert.live_rows("not json") == [] and cert.live_rows(None) == []
