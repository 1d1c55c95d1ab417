"""The quantization certificate: one signed document that binds a build to its evidence.

What it binds, inside one JSON ``payload``:

* ``model``: the checkpoint's identity as the preflight run hashed it (name, format,
  quantization method, bits, group size, SHA-256 of every weight file);
* ``engine``: what served the candidate and the reference (engine, version, model);
* ``preflight``: the preflight report's **exact bytes** (base64) with their SHA-256,
  its approvals and the sign-off policy they were checked under;
* ``live``: the evidence after launch, when given (a JSON document embedded
  verbatim with its SHA-256), else ``null`` and said so.

The envelope is the command signing's (``schemas.signing``): the payload travels
as a string and the MAC covers ``CERTIFICATE_DOMAIN`` + its UTF-8 bytes, so no
verifier re-serialises JSON, and a certificate is never a valid command or score
envelope, nor the reverse::

    {"schema_version": 1, "kind": "quantdrift.certificate.v1",
     "key_id": "ops", "signature": "<hex>", "payload": "<JSON text>"}

Verification needs nothing but the document and the key ring: no Redis, no
broker, no file beside it. The same HMAC-SHA256 key ring as commands, scores
and approvals: whoever verifies holds a key of the ring, as a gateway does.
(A verifier that must not be able to sign needs a public-key signature; that
is a different key type, not a different document.) The steps, in any language
(``examples/verify_certificate.js`` does them with Node's built-in crypto):

1. HMAC-SHA256 of ``CERTIFICATE_DOMAIN`` + ``payload`` (UTF-8) with
   ``keys[key_id]`` equals ``signature`` (hex), compared in constant time;
2. parse ``payload``; base64-decode ``preflight.report``; its SHA-256 equals
   ``preflight.report_sha256``; the report says ``"verdict": "go"``;
3. every approval counted is a valid sign-off approval of those bytes
   (``schemas.signoff``: HMAC over length-prefixed SHA-256, name, time, key id),
   and at least ``preflight.required`` distinct names (distinct key ids with
   ``distinct_keys``) hold one;
4. ``model`` equals the report's ``subject.checkpoint`` and ``engine`` its
   ``subject.engines``: the certificate cannot name another build than the one
   the signed report measured;
5. ``live.sha256`` is the SHA-256 of ``live.text``: the live evidence document
   as it was given, embedded as a string (again, no re-serialisation).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from quantdrift.schemas.signoff import digest, verify

CERTIFICATE_DOMAIN = b"quantdrift.certificate.v1\n"
KIND = "quantdrift.certificate.v1"


def _mac(key: bytes, payload: str) -> str:
    return hmac.new(key, CERTIFICATE_DOMAIN + payload.encode(), hashlib.sha256).hexdigest()


def issue(
    report_bytes: bytes,
    approvals: Sequence[Mapping[str, Any]],
    *,
    required: int,
    distinct_keys: bool,
    key_id: str,
    key: bytes,
    issued_at: float,
    live_text: str | None = None,
) -> dict[str, Any]:
    """The signed envelope (pure). Raises ValueError on a report that is not JSON."""
    report = json.loads(report_bytes)
    subject = report.get("subject") or {}
    live = None
    if live_text is not None:
        live = {"sha256": digest(live_text.encode()), "text": live_text}
    payload = {
        "kind": KIND,
        "issued_at": round(issued_at, 3),
        "route": subject.get("route"),
        "model": subject.get("checkpoint"),
        "engine": subject.get("engines") or {},
        "preflight": {
            "report": base64.b64encode(report_bytes).decode(),
            "report_sha256": digest(report_bytes),
            "verdict": report.get("verdict"),
            "approvals": [dict(a) for a in approvals],
            "required": required,
            "distinct_keys": distinct_keys,
        },
        "live": live,
    }
    text = json.dumps(payload, ensure_ascii=False, allow_nan=False, sort_keys=True)
    return {
        "schema_version": 1,
        "kind": KIND,
        "key_id": key_id,
        "signature": _mac(key, text),
        "payload": text,
    }


@dataclass(frozen=True, slots=True)
class CertificateCheck:
    ok: bool
    problems: list[str] = field(default_factory=list)
    signers: list[str] = field(default_factory=list)
    payload: dict[str, Any] | None = None


def check(envelope_bytes: bytes, keys: Mapping[str, bytes]) -> CertificateCheck:
    """Verify a certificate from its bytes and the key ring alone (pure)."""
    try:
        env = json.loads(envelope_bytes)
        key_id, sig, text = str(env["key_id"]), str(env["signature"]), env["payload"]
        if env.get("kind") != KIND or not isinstance(text, str):
            raise ValueError
    except (ValueError, KeyError, TypeError):
        return CertificateCheck(False, ["not a quantdrift certificate"])
    if key_id not in keys:
        return CertificateCheck(False, [f"unknown key id {key_id!r}"])
    if not hmac.compare_digest(_mac(keys[key_id], text), sig):
        return CertificateCheck(False, ["bad signature: the certificate was altered or forged"])
    payload = json.loads(text)
    problems: list[str] = []
    pf = payload.get("preflight") or {}
    try:
        raw = base64.b64decode(pf["report"], validate=True)
        report = json.loads(raw)
    except (KeyError, TypeError, ValueError):
        return CertificateCheck(False, ["the embedded preflight report is unreadable"])
    if digest(raw) != pf.get("report_sha256"):
        problems.append("the embedded report does not match its SHA-256")
    v = verify(
        raw,
        pf.get("approvals") or [],
        keys,
        required=int(pf.get("required", 2)),
        distinct_keys=bool(pf.get("distinct_keys")),
    )
    problems += [f"preflight: {p}" for p in v.problems]
    subject = report.get("subject") or {}
    if payload.get("model") != subject.get("checkpoint"):
        problems.append("model identity differs from the signed report's checkpoint")
    if payload.get("engine") != (subject.get("engines") or {}):
        problems.append("engine fingerprint differs from the signed report's engines")
    live = payload.get("live")
    if live is not None and digest(str(live.get("text", "")).encode()) != live.get("sha256"):
        problems.append("the live evidence does not match its SHA-256")
    return CertificateCheck(not problems, problems, v.signers, payload)
