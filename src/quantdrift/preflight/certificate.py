"""``quantdrift preflight certificate``: issue and check a quantization certificate on disk.

The format and its verification live in :mod:`quantdrift.schemas.certificate`
with the other signing code; this module reads the files. A certificate is only
issued for a report that verifies now (``go`` and its sign-off policy met under
the key ring): a certificate of an unsigned launch would certify nothing.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from quantdrift.errors import ConfigError, SignatureError
from quantdrift.preflight.signoff import policy_of
from quantdrift.schemas.certificate import CertificateCheck, check, issue
from quantdrift.schemas.signoff import key_ring, read_approvals, verify


def _read(path: Path, what: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{what} {path}: {exc.strerror or exc}") from exc


def issue_file(
    report: Path, out: Path, signing: Any, now: float, live: Path | None = None
) -> dict[str, Any]:
    """Write the certificate of REPORT (and its approvals) to ``out``; returns the envelope."""
    raw = _read(report, "report")
    try:
        required, distinct = policy_of(json.loads(raw))
    except (ValueError, AttributeError) as exc:
        raise ConfigError(f"report {report}: not a preflight report") from exc
    key_id, keys = key_ring(signing)
    if key_id not in keys:
        raise ConfigError(f"active signing key {key_id!r} is not in the key ring")
    approvals = read_approvals(report)
    v = verify(raw, approvals, keys, required=required, distinct_keys=distinct)
    if not v.ok:
        raise SignatureError(f"{report.name} does not verify: {'; '.join(v.problems)}")
    live_text = None
    if live is not None:
        live_text = _read(live, "live evidence").decode("utf-8", "replace")
        try:
            json.loads(live_text)
        except ValueError as exc:
            raise ConfigError(f"live evidence {live}: not JSON") from exc
    envelope = issue(
        raw,
        approvals,
        required=required,
        distinct_keys=distinct,
        key_id=key_id,
        key=keys[key_id],
        issued_at=now,
        live_text=live_text,
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(envelope, indent=2) + "\n")
    return envelope


def check_file(path: Path, signing: Any) -> CertificateCheck:
    _, keys = key_ring(signing)
    return check(_read(path, "certificate"), keys)
