"""Two-person sign-off: ``preflight sign REPORT --by NAME`` and ``preflight verify REPORT``.

The approval format (what is hashed and signed, the sidecar file, verification) lives
in :mod:`quantdrift.schemas.signoff`, next to the command signing; this module holds
the act of signing a report on disk, and ``block``: what the launch page's sign-off
block shows (each approval checked against the report's exact bytes, the policy's
count, what is still missing), by the same ``check_approval`` and ``verify`` the
gateway's launch gate and ``preflight verify`` use, so the page cannot disagree
with them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from quantdrift.errors import ConfigError, SignatureError
from quantdrift.schemas.ed25519 import TrustedKey
from quantdrift.schemas.signoff import (
    Verification,
    approve,
    check_approval,
    digest,
    key_ring,
    read_approvals,
    sidecar,
    signing_key,
    trusted,
    verify,
)

__all__ = [
    "Block",
    "Signature",
    "Verification",
    "approve",
    "block",
    "check_approval",
    "digest",
    "key_ring",
    "policy_of",
    "read_approvals",
    "sidecar",
    "sign_file",
    "signing_key",
    "trusted",
    "verify",
]


def sign_file(
    report: Path, by: str, signing: Any, now: float, key_file: Path | None = None
) -> dict[str, Any]:
    """Append an approval to REPORT.signoff.json; refuses to sign a no-go report.

    Signed with ``key_file`` or ``signing.private_key_file`` (Ed25519) when one is
    given, else with the ring's active HMAC key (``schemas.signoff.signing_key``).
    """
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
    key_id, key = signing_key(signing, key_file)
    approvals = read_approvals(report)
    record = approve(raw, by, key_id, key, now)
    approvals.append(record)
    sidecar(report).write_text(json.dumps({"approvals": approvals}, indent=2) + "\n")
    return record


DEFAULT_REQUIRED = 2
BlockState = Literal["not-signable", "unsigned", "partial", "complete", "broken"]


@dataclass(frozen=True, slots=True)
class Signature:
    """One approval as the page lists it: who, when, which key, and does it verify."""

    by: str
    key_id: str
    signed_at: float | None
    verifies: bool
    problem: str | None


@dataclass(frozen=True, slots=True)
class Block:
    """The sign-off block: the policy, the approvals, and what is still missing.

    ``state``: ``not-signable`` (the report says no-go), ``unsigned`` (no approval),
    ``partial`` (valid approvals, fewer than required), ``complete`` (verified),
    ``broken`` (an approval does not verify against these bytes and the rest are
    not enough: the report was edited after it was signed, or a key is unknown).
    """

    state: BlockState
    required: int
    distinct_keys: bool
    report_sha256: str
    signatures: list[Signature]
    valid: int
    missing: list[str]
    verification: Verification


def policy_of(report: Mapping[str, Any]) -> tuple[int, bool]:
    """(signers required, distinct keys) recorded in the report; the defaults otherwise.

    >>> policy_of({"signoff_policy": {"required": 3, "distinct_keys": True}})
    (3, True)
    >>> policy_of({})
    (2, False)
    """
    p = report.get("signoff_policy") or {}
    return int(p.get("required", DEFAULT_REQUIRED)), bool(p.get("distinct_keys", False))


def block(
    report_bytes: bytes,
    approvals: Sequence[Mapping[str, Any]],
    keys: Mapping[str, TrustedKey],
    required: int = DEFAULT_REQUIRED,
    distinct_keys: bool = False,
) -> Block:
    """What the sign-off block shows (pure)."""
    result = verify(report_bytes, approvals, keys, required=required, distinct_keys=distinct_keys)
    sigs = []
    for a in approvals:
        why = check_approval(report_bytes, a, keys)
        try:
            at: float | None = float(a.get("signed_at"))  # type: ignore[arg-type]
        except (TypeError, ValueError):
            at = None
        by = str(a.get("by", "?"))
        if why and why.startswith(f"{by}: "):  # the row names the signer already
            why = why[len(by) + 2 :]
        sigs.append(Signature(by, str(a.get("key_id", "?")), at, not why, why))
    valid_keys = {s.key_id for s in sigs if s.verifies}
    valid = len(valid_keys) if distinct_keys else len(result.signers)
    missing = []
    if result.verdict != "go":
        missing.append(f"the report says {result.verdict!r}: only a 'go' report can be approved")
    elif valid < required:
        what = "signer" + ("s" if required - valid > 1 else "")
        keyed = " with a key of their own" if distinct_keys else ""
        missing.append(f"{required - valid} more {what}{keyed} ({valid} of {required} so far)")
    missing += [f"{s.by} ({s.key_id}): {s.problem}" for s in sigs if not s.verifies]
    state: BlockState
    if result.verdict != "go":
        state = "not-signable"
    elif result.ok:
        state = "complete"
    elif any(not s.verifies for s in sigs):
        state = "broken"
    elif valid:
        state = "partial"
    else:
        state = "unsigned"
    return Block(state, required, distinct_keys, digest(report_bytes), sigs, valid, missing, result)
