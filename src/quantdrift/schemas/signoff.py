"""The sign-off format: approvals of a launch report, HMAC-signed with the command key ring.

It sits with the other signing code so that the gateway's launch gate (which verifies)
and the preflight command (which signs) share one definition without the gateway
importing preflight.

An approval is an HMAC-SHA256, with the same key ring as RouteCommands
(``Settings().signing``), over the SHA-256 of the report's exact bytes plus
the signer's name and time. Approvals live beside the report in
``REPORT.signoff.json``, so the report's bytes never change after it was
written and anyone can re-hash it. ``verify`` passes only when the report says
``go`` and at least two *distinct* names hold a valid approval of these bytes.

What this proves and what it does not: a valid approval shows the signer held
a key of the ring when signing this exact report. With one shared key, names
are a process control, not cryptographic identity; give each approver their
own key id in the ring and ``--distinct-keys`` requires two different keys.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quantdrift.errors import ConfigError


def sidecar(report: Path) -> Path:
    return report.with_name(report.name + ".signoff.json")


def digest(report_bytes: bytes) -> str:
    return hashlib.sha256(report_bytes).hexdigest()


def _message(sha: str, by: str, signed_at: float, key_id: str) -> bytes:
    # Length-prefixed fields: no name can be crafted to collide with another split.
    fields = [sha, by, f"{signed_at:.3f}", key_id]
    return b"".join(len(f.encode()).to_bytes(4, "big") + f.encode() for f in fields)


def approve(
    report_bytes: bytes, by: str, key_id: str, key: bytes, signed_at: float
) -> dict[str, Any]:
    """One approval record (pure)."""
    if not by.strip():
        raise ValueError("a signer's name is needed")
    sha = digest(report_bytes)
    mac = hmac.new(key, _message(sha, by, signed_at, key_id), hashlib.sha256).hexdigest()
    return {
        "by": by,
        "key_id": key_id,
        "signed_at": round(signed_at, 3),
        "report_sha256": sha,
        "signature": mac,
    }


def check_approval(
    report_bytes: bytes, a: Mapping[str, Any], keys: Mapping[str, bytes]
) -> str | None:
    """None if ``a`` is a valid approval of these bytes, else why not (pure)."""
    try:
        by, key_id, at, sig = (
            str(a["by"]),
            str(a["key_id"]),
            float(a["signed_at"]),
            str(a["signature"]),
        )
    except (KeyError, TypeError, ValueError):
        return "malformed approval"
    if key_id not in keys:
        return f"{by}: unknown key id {key_id!r}"
    sha = digest(report_bytes)
    if a.get("report_sha256") != sha:
        return f"{by}: signed another version of the report"
    want = hmac.new(keys[key_id], _message(sha, by, at, key_id), hashlib.sha256).hexdigest()
    if not hmac.compare_digest(want, sig):
        return f"{by}: bad signature"
    return None


@dataclass(frozen=True, slots=True)
class Verification:
    ok: bool
    verdict: str | None
    signers: list[str]
    problems: list[str]


def verify(
    report_bytes: bytes,
    approvals: Sequence[Mapping[str, Any]],
    keys: Mapping[str, bytes],
    required: int = 2,
    distinct_keys: bool = False,
) -> Verification:
    """``go`` and ``required`` distinct valid signers (pure)."""
    problems: list[str] = []
    try:
        verdict = json.loads(report_bytes).get("verdict")
    except ValueError:
        return Verification(False, None, [], ["the report is not JSON"])
    if verdict != "go":
        problems.append(f"verdict is {verdict!r}, not 'go'")
    signers: dict[str, str] = {}
    for a in approvals:
        why = check_approval(report_bytes, a, keys)
        if why:
            problems.append(why)
        else:
            signers.setdefault(str(a["by"]), str(a["key_id"]))
    count = len(set(signers.values())) if distinct_keys else len(signers)
    if count < required:
        what = "distinct keys" if distinct_keys else "distinct signers"
        problems.append(f"{count} {what} with a valid approval, {required} needed")
    ok = verdict == "go" and count >= required
    return Verification(ok, verdict, sorted(signers), problems)


def verify_file(
    report: Path,
    keys: Mapping[str, bytes],
    required: int = 2,
    distinct_keys: bool = False,
) -> Verification:
    """``verify`` of a report on disk and its sidecar, both re-read now.

    A report or sidecar that cannot be read fails verification with the reason,
    rather than raising: the verdict API and the gateway's launch gate answer
    "not verified" for it, as for any other problem.
    """
    try:
        raw = report.read_bytes()
        approvals = read_approvals(report)
    except OSError as exc:
        return Verification(False, None, [], [f"{report}: {exc.strerror or exc}"])
    except ConfigError as exc:
        return Verification(False, None, [], [str(exc)])
    return verify(raw, approvals, keys, required=required, distinct_keys=distinct_keys)


def key_ring(signing: Any) -> tuple[str, dict[str, bytes]]:
    """(active key id, {key id: secret bytes}) from ``Settings().signing``."""
    keys = {}
    for k, v in signing.keys.items():
        getter = getattr(v, "get_secret_value", None)
        keys[str(k)] = str(getter() if getter else v).encode()
    return str(signing.active_key_id), keys


def read_approvals(report: Path) -> list[dict[str, Any]]:
    path = sidecar(report)
    if not path.exists():
        return []
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path}: {exc}") from exc
    return list(data.get("approvals", []))
