"""The quantization certificate: one signed document that binds a build to its evidence.

What it binds, inside one JSON ``payload``:

* ``model``: the checkpoint's identity as the preflight run hashed it (name, format,
  quantization method, bits, group size, SHA-256 of every weight file);
* ``engine``: what served the candidate and the reference (engine, version, model);
* ``preflight``: the preflight report's **exact bytes** (base64) with their SHA-256,
  its approvals and the sign-off policy they were checked under;
* ``live``: the evidence after launch, when given (a JSON document embedded
  verbatim with its SHA-256), else ``null`` and said so.

The envelope carries the payload as a string, and the signature covers
``CERTIFICATE_DOMAIN`` + its UTF-8 bytes, so no verifier re-serialises JSON, and a
certificate is never a valid command, score or approval::

    {"schema_version": 2, "kind": "quantdrift.certificate.v2", "alg": "ed25519",
     "key_id": "ed25519:<16 hex>", "signature": "<hex>", "payload": "<JSON text>"}

It is signed with an Ed25519 private key (``schemas.ed25519``) and verified with the
public keys alone, the issuer's and the approvers': no Redis, no broker, no file
beside it, and no secret, so whoever verifies cannot forge. The steps, in any
language (``examples/verify_certificate.js`` does them with Node's built-in crypto):

1. ``key_id`` names a trusted public key (its id is ``ed25519:`` + the first 16 hex
   digits of SHA-256 of the key's 32 raw bytes), and the Ed25519 signature (hex)
   of ``CERTIFICATE_DOMAIN`` + ``payload`` (UTF-8) verifies under it;
2. parse ``payload``; base64-decode ``preflight.report``; its SHA-256 equals
   ``preflight.report_sha256``; the report says ``"verdict": "go"``;
3. every approval counted is a valid Ed25519 sign-off approval of those bytes by a
   trusted public key (``schemas.signoff``: the signature of ``SIGNOFF_DOMAIN`` + four
   length-prefixed fields: SHA-256, name, time, key id), and at least
   ``preflight.required`` distinct names (distinct key ids with ``distinct_keys``)
   hold one;
4. ``model`` equals the report's ``subject.checkpoint`` and ``engine`` its
   ``subject.engines``: the certificate cannot name another build than the one
   the signed report measured;
5. ``live.sha256`` is the SHA-256 of ``live.text``: the live evidence document
   as it was given, embedded as a string (again, no re-serialisation);
6. when ``live.text`` is ``route status --json``, each route's time window,
   calibration and worst pairs by hash are present and consistent
   (``schemas.certificate_live``).

Version 1 was HMAC-signed with the project's key ring: only a ring holder could
check it, and any ring holder could have forged it, so it proved nothing to an
outside reader. It is refused with that reason, and re-issuing it from the same
signed report (approvals re-signed with Ed25519 keys) gives a version 2. Reports
and their HMAC approvals are unchanged: the gateway's launch gate still reads them.
"""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from quantdrift.errors import ConfigError
from quantdrift.schemas import ed25519
from quantdrift.schemas.certificate_live import live_problems
from quantdrift.schemas.ed25519 import TrustedKey
from quantdrift.schemas.signoff import digest, trusted, verify

CERTIFICATE_DOMAIN = b"quantdrift.certificate.v2\n"
KIND = "quantdrift.certificate.v2"
V1_KIND = "quantdrift.certificate.v1"
V1_REFUSED = (
    "a version 1 certificate (HMAC-signed with the key ring): only a ring holder can "
    "check it and any ring holder could have forged it; re-issue it with "
    "`quantdrift preflight certificate` (Ed25519)"
)


def issue(
    report_bytes: bytes,
    approvals: Sequence[Mapping[str, Any]],
    *,
    required: int,
    distinct_keys: bool,
    key: ed25519.PrivateKey,
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
        "schema_version": 2,
        "kind": KIND,
        "alg": ed25519.ALG,
        "key_id": ed25519.key_id(key.public_key()),
        "signature": ed25519.sign(key, CERTIFICATE_DOMAIN + text.encode()),
        "payload": text,
    }


@dataclass(frozen=True, slots=True)
class CertificateCheck:
    """``ok`` only when every step of the module docstring holds; ``signature_ok`` when
    step 1 does (the payload is then the issuer's, even if a later step fails)."""

    ok: bool
    problems: list[str] = field(default_factory=list)
    signers: list[str] = field(default_factory=list)
    payload: dict[str, Any] | None = None
    key_id: str = ""
    signature_ok: bool = False


def _refused(why: str, key_id: str = "") -> CertificateCheck:
    return CertificateCheck(False, [why], key_id=key_id)


def check(envelope_bytes: bytes, keys: Mapping[str, TrustedKey]) -> CertificateCheck:
    """Verify a certificate from its bytes and the trusted public keys alone (pure).

    ``keys`` may hold the HMAC ring too (``signoff.trusted``): only its public keys count.
    """
    try:
        env = json.loads(envelope_bytes)
        kind, text = env.get("kind"), env.get("payload")
        if kind == V1_KIND:
            return _refused(V1_REFUSED, str(env.get("key_id", "")))
        key_id, sig = str(env["key_id"]), str(env["signature"])
        if kind != KIND or not isinstance(text, str):
            raise ValueError
    except (ValueError, KeyError, TypeError, AttributeError):
        return _refused("not a quantdrift certificate")
    public = {k: v for k, v in keys.items() if isinstance(v, ed25519.PublicKey)}
    if key_id not in public:
        return _refused(
            f"signed by {key_id}, which is not a trusted public key (give its public key)",
            key_id,
        )
    if not ed25519.verifies(public[key_id], sig, CERTIFICATE_DOMAIN + text.encode()):
        return _refused("bad signature: the certificate was altered or forged", key_id)
    payload = json.loads(text)
    problems: list[str] = []
    pf = payload.get("preflight") or {}
    try:
        raw = base64.b64decode(pf["report"], validate=True)
        report = json.loads(raw)
    except (KeyError, TypeError, ValueError):
        return CertificateCheck(
            False, ["the embedded preflight report is unreadable"], [], payload, key_id, True
        )
    if digest(raw) != pf.get("report_sha256"):
        problems.append("the embedded report does not match its SHA-256")
    approvals = pf.get("approvals") or []
    for a in approvals:
        if a.get("alg") != ed25519.ALG:
            problems.append(
                f"preflight: {a.get('by')}: an HMAC approval (key {a.get('key_id')!r}); "
                "a certificate needs Ed25519 approvals"
            )
    v = verify(
        raw,
        [a for a in approvals if a.get("alg") == ed25519.ALG],
        public,
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
    if live is not None:
        problems += live_problems(str(live.get("text", "")), float(payload.get("issued_at") or 0))
    return CertificateCheck(not problems, problems, v.signers, payload, key_id, True)


def check_file(path: Path, signing: Any, public_keys: Sequence[Path] = ()) -> CertificateCheck:
    """``check`` of a certificate on disk, with ``signing.public_keys`` and ``public_keys``.

    One reader for every caller (``verify-certificate``, the page, the events, the
    verdict API's routes); a file that cannot be read is a ConfigError, said once.
    """
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"certificate {path}: {exc.strerror or exc}") from exc
    return check(raw, {**trusted(signing), **ed25519.public_ring(public_keys)})


def engine_identity(info: Any) -> str | None:
    """The certified candidate as ``EngineInfo.identity`` writes it (engine/version/model).

    >>> engine_identity({"engine": "vllm", "version": "0.31.0", "model": "smol-int4"})
    'vllm/0.31.0/smol-int4'
    >>> engine_identity({}) is None
    True
    """
    if not isinstance(info, Mapping) or not any(info.get(k) for k in ("engine", "model")):
        return None
    return "/".join(str(info.get(k) or "?") for k in ("engine", "version", "model"))


def live_rows(live_text: str | None) -> list[dict[str, Any]]:
    """The live evidence per route and slice, read from the embedded document (pure).

    Two documents are understood: ``quantdrift route status --json`` (one row per
    route, with its slices: pairs judged, ``testing`` or ``insufficient_data``, and
    each test's log e-value; the route's own row has its tests and its verdict too)
    and ``quantdrift replay --json`` (pairs and trips per route). Anything else
    yields no rows: the document is still bound, verbatim.
    Each row: ``route``, ``slice`` (``"all"`` for the route), ``pairs``, ``status``,
    ``e_value`` (the largest of its tests, None without one) and ``detail``.

    >>> rows = live_rows('[{"route": "r", "pairs_seen": 40, "readiness": "armed",'
    ...     ' "reason": "ok", "slices": [{"slice": "language=zh", "pairs": 3,'
    ...     ' "status": "insufficient_data", "tests": {}}]}]')
    >>> [(r["slice"], r["pairs"], r["status"]) for r in rows]
    [('all', 40, 'armed'), ('language=zh', 3, 'insufficient_data')]
    """
    try:
        doc = json.loads(live_text) if live_text else None
    except ValueError:
        return []
    rows: list[dict[str, Any]] = []

    def e_value(tests: Any) -> float | None:
        logs = [
            float(t["log_r_max"])
            for t in (tests or {}).values()
            if isinstance(t, Mapping) and isinstance(t.get("log_r_max"), int | float)
        ]
        return round(math.exp(min(max(logs), 700.0)), 3) if logs else None

    if isinstance(doc, list):  # route status --json
        for r in doc:
            if not isinstance(r, Mapping) or "route" not in r:
                continue
            rows.append(
                {
                    "route": str(r["route"]),
                    "slice": "all",
                    "pairs": int(r.get("pairs_seen") or 0),
                    "status": str(r.get("readiness") or r.get("state") or "unknown"),
                    "e_value": e_value(r.get("tests")),
                    "detail": (f"verdict {r['verdict']}: " if r.get("verdict") else "")
                    + str(r.get("reason") or ""),
                }
            )
            for s in r.get("slices") or []:
                rows.append(
                    {
                        "route": str(r["route"]),
                        "slice": str(s.get("slice")),
                        "pairs": int(s.get("pairs") or 0),
                        "status": str(s.get("status") or "unknown"),
                        "e_value": e_value(s.get("tests")),
                        "detail": f"{s.get('min_pairs', '?')} pairs needed to decide",
                    }
                )
    elif isinstance(doc, Mapping) and isinstance(doc.get("routes"), Mapping):  # replay --json
        for route, r in doc["routes"].items():
            trips = [t for t in r.get("trips") or [] if isinstance(t, Mapping)]
            rules = ", ".join(sorted({str(t.get("rule")) for t in trips}))
            rows.append(
                {
                    "route": str(route),
                    "slice": "all",
                    "pairs": int(r.get("shadow_pairs") or 0),
                    "status": "tripped" if trips else "no trip",
                    "e_value": None,
                    "detail": f"{len(trips)} trips ({rules})" if trips else "no rule fired",
                }
            )
    return rows
