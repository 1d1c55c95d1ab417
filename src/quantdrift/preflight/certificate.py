"""``quantdrift preflight certificate``: issue and check a quantization certificate on disk.

The format and its verification live in :mod:`quantdrift.schemas.certificate`
with the other signing code; this module reads the files. A certificate is only
issued for a report that verifies now (``go`` and its sign-off policy met) by
Ed25519 approvals and public keys alone, and only with an Ed25519 private key:
a certificate is read outside the project, so nothing in it may need a secret to
check (``schemas.ed25519`` says why). An unsigned launch would certify nothing.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from quantdrift.errors import ConfigError, SignatureError
from quantdrift.preflight.signoff import policy_of
from quantdrift.schemas import ed25519
from quantdrift.schemas.certificate import check_file, issue
from quantdrift.schemas.certificate_live import live_problems
from quantdrift.schemas.signoff import read_approvals, signing_key, trusted, verify

__all__ = ["check_file", "issue_file", "keygen"]


def _read(path: Path, what: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{what} {path}: {exc.strerror or exc}") from exc


def issue_file(
    report: Path,
    out: Path,
    signing: Any,
    now: float,
    live: Path | None = None,
    key_file: Path | None = None,
) -> dict[str, Any]:
    """Write the certificate of REPORT (and its approvals) to ``out``; returns the envelope.

    Signed with ``key_file`` or ``signing.private_key_file``; the approvals must verify
    under ``signing.public_keys`` (HMAC approvals are refused, with who re-signs).
    """
    raw = _read(report, "report")
    try:
        required, distinct = policy_of(json.loads(raw))
    except (ValueError, AttributeError) as exc:
        raise ConfigError(f"report {report}: not a preflight report") from exc
    _, key = signing_key(signing, key_file)
    if not isinstance(key, ed25519.PrivateKey):
        raise ConfigError(
            "a certificate is signed with an Ed25519 private key: pass --key FILE or set "
            "signing.private_key_file (`quantdrift preflight keygen` makes one)"
        )
    approvals = read_approvals(report)
    hmac_signed = sorted({str(a.get("by")) for a in approvals if a.get("alg") != ed25519.ALG})
    if hmac_signed:
        raise SignatureError(
            f"{report.name}: approvals by {', '.join(hmac_signed)} are HMAC-signed; a "
            "certificate needs approvals anyone can check: re-sign with "
            "`quantdrift preflight sign --key FILE` (Ed25519)"
        )
    public = {k: v for k, v in trusted(signing).items() if isinstance(v, ed25519.PublicKey)}
    v = verify(raw, approvals, public, required=required, distinct_keys=distinct)
    if not v.ok:
        raise SignatureError(f"{report.name} does not verify: {'; '.join(v.problems)}")
    live_text = None
    if live is not None:
        live_text = _read(live, "live evidence").decode("utf-8", "replace")
        try:
            json.loads(live_text)
        except ValueError as exc:
            raise ConfigError(f"live evidence {live}: not JSON") from exc
        if wrong := live_problems(live_text, now):
            raise ConfigError(f"{live}: {'; '.join(wrong)}")
    envelope = issue(
        raw,
        approvals,
        required=required,
        distinct_keys=distinct,
        key=key,
        issued_at=now,
        live_text=live_text,
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(envelope, indent=2) + "\n")
    return envelope


def keygen(out: Path) -> str:
    """Write a new Ed25519 private key to ``out`` (mode 0600) and its public key to
    ``out`` + ``.pub``; returns the key id. Refuses to overwrite a key."""
    pub = out.with_name(out.name + ".pub")
    for path in (out, pub):
        if path.exists():
            raise ConfigError(f"{path} exists: refusing to overwrite a key")
    key = ed25519.generate()
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "xb", opener=lambda p, flags: os.open(p, flags, 0o600)) as f:
        f.write(ed25519.private_pem(key))
    pub.write_bytes(ed25519.public_pem(key.public_key()))
    return ed25519.key_id(key.public_key())
