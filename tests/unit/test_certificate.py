"""The certificate format: what it binds, and what verification refuses (pure).

Across the seams (a real preflight run, ``preflight sign``, ``quantdrift replay``
for live evidence, the CLI and the Node.js verifier): tests/integration/
test_preflight_certificate.py.
"""

from __future__ import annotations

import json

from quantdrift.preflight.report import Item, build_report, report_bytes
from quantdrift.schemas import certificate as cert
from quantdrift.schemas.signoff import approve

KEYS = {"ops": b"ops-key-of-at-least-32-bytes-long!!", "ml": b"ml-key-of-at-least-32-bytes-long!!!"}
CKPT = {"name": "m", "format": "safetensors", "bits": 4.0, "group_size": 128, "files": {"a": "1"}}


def _issue(live: str | None = None, approvals: int = 2, **subject: object) -> bytes:
    subj = {"route": "r/int4", "checkpoint": CKPT, "engines": {"candidate": {"engine": "vllm"}}}
    raw = report_bytes(build_report([Item("probes", "P", "pass")], subject={**subj, **subject}))
    signed = [approve(raw, n, k, KEYS[k], 1.0) for n, k in (("alice", "ops"), ("bob", "ml"))]
    env = cert.issue(raw, signed[:approvals], required=2, distinct_keys=False, key_id="ops",
                     key=KEYS["ops"], issued_at=5.0, live_text=live)  # fmt: skip
    return json.dumps(env).encode()


def test_a_certificate_of_a_signed_go_report_verifies_with_the_ring_alone() -> None:
    c = cert.check(_issue(live='{"pairs": 3}'), KEYS)
    assert c.ok and c.signers == ["alice", "bob"] and c.problems == []
    assert c.payload is not None and c.payload["model"] == CKPT
    assert c.payload["live"]["text"] == '{"pairs": 3}'


def test_what_verification_refuses() -> None:
    good = _issue()
    assert cert.check(good, {"ml": KEYS["ml"]}).problems == ["unknown key id 'ops'"]
    assert not cert.check(good.replace(b"r/int4", b"r/int8"), KEYS).ok  # bytes edited
    assert cert.check(b"{}", KEYS).problems == ["not a quantdrift certificate"]
    one = cert.check(_issue(approvals=1), KEYS)
    assert one.problems == ["preflight: 1 distinct signers with a valid approval, 2 needed"]
    # A command envelope's MAC is not a certificate's: the domains differ.
    env = json.loads(good)
    assert not cert.check(json.dumps({**env, "signature": "00" * 32}).encode(), KEYS).ok
