"""Two-person sign-off: ``preflight sign REPORT --by NAME`` and ``preflight verify REPORT``.

The approval format (what is hashed and signed, the sidecar file, verification) lives
in :mod:`quantdrift.schemas.signoff`, next to the command signing; this module holds
the act of signing a report on disk.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from quantdrift.errors import ConfigError, SignatureError
from quantdrift.schemas.signoff import (
    Verification,
    approve,
    check_approval,
    digest,
    key_ring,
    read_approvals,
    sidecar,
    verify,
)

__all__ = [
    "Verification",
    "approve",
    "check_approval",
    "digest",
    "key_ring",
    "read_approvals",
    "sidecar",
    "sign_file",
    "verify",
]


def sign_file(report: Path, by: str, signing: Any, now: float) -> dict[str, Any]:
    """Append an approval to REPORT.signoff.json; refuses to sign a no-go report."""
    try:
        raw = report.read_bytes()
    except OSError as exc:
        raise ConfigError(f"report {report}: {exc.strerror or exc}") from exc
    try:
        verdict = json.loads(raw).get("verdict")
    except ValueError as exc:
        raise ConfigError(f"report {report}: not JSON") from exc
    if verdict != "go":
        raise SignatureError(f"{report.name} says {verdict!r}: only a 'go' report can be approved")
    key_id, keys = key_ring(signing)
    if key_id not in keys:
        raise ConfigError(f"active signing key {key_id!r} is not in the key ring")
    approvals = read_approvals(report)
    record = approve(raw, by, key_id, keys[key_id], now)
    approvals.append(record)
    sidecar(report).write_text(json.dumps({"approvals": approvals}, indent=2) + "\n")
    return record
