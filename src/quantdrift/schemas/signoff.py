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

Approvals signed with an Ed25519 private key (``signing.private_key_file``,
``schemas.ed25519``) are the identity the HMAC ones are not: each approver holds
their own private key, and anyone holding the public keys checks the approval
without being able to forge one, so a certificate's approvals verify outside the
project. Such a record says ``"alg": "ed25519"``, its ``key_id`` is the public
key's derived id, and the signature (hex) covers ``SIGNOFF_DOMAIN`` + the same four
length-prefixed fields. HMAC approvals (no ``alg``) still verify with the ring as
before: reports signed before Ed25519 keep their sign-off.
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
from quantdrift.schemas import ed25519
from quantdrift.schemas.ed25519 import TrustedKey

# What an Ed25519 approval signs starts with this; an HMAC approval's message does not.
SIGNOFF_DOMAIN = b"quantdrift.signoff.v2\n"
# A signing key: an HMAC secret of the ring, or an Ed25519 private key.
SigningKey = bytes | ed25519.PrivateKey


def sidecar(report: Path) -> Path:
    return report.with_name(report.name + ".signoff.json")


def digest(report_bytes: bytes) -> str:
    return hashlib.sha256(report_bytes).hexdigest()


def _message(sha: str, by: str, signed_at: float, key_id: str) -> bytes:
    # Length-prefixed fields: no name can be crafted to collide with another split.
    fields = [sha, by, f"{signed_at:.3f}", key_id]
    return b"".join(len(f.encode()).to_bytes(4, "big") + f.encode() for f in fields)


def approve(
    report_bytes: bytes, by: str, key_id: str, key: SigningKey, signed_at: float
) -> dict[str, Any]:
    """One approval record (pure). With an Ed25519 key, ``key_id`` is the key's own id."""
    if not by.strip():
        raise ValueError("a signer's name is needed")
    sha = digest(report_bytes)
    record: dict[str, Any] = {"by": by}
    if isinstance(key, ed25519.PrivateKey):
        key_id = ed25519.key_id(key.public_key())
        message = _message(sha, by, signed_at, key_id)
        record["alg"] = ed25519.ALG
        signature = ed25519.sign(key, SIGNOFF_DOMAIN + message)
    else:
        message = _message(sha, by, signed_at, key_id)
        signature = hmac.new(key, message, hashlib.sha256).hexdigest()
    return {
        **record,
        "key_id": key_id,
        "signed_at": round(signed_at, 3),
        "report_sha256": sha,
        "signature": signature,
    }


def check_approval(
    report_bytes: bytes, a: Mapping[str, Any], keys: Mapping[str, TrustedKey]
) -> str | None:
    """None if ``a`` is a valid approval of these bytes, else why not (pure).

    ``keys``: the HMAC ring and the trusted Ed25519 public keys by id (``trusted``).
    """
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
    key, message = keys[key_id], _message(sha, by, at, key_id)
    if isinstance(key, ed25519.PublicKey):
        if a.get("alg") != ed25519.ALG:
            return f"{by}: key {key_id} is an Ed25519 key but the approval is not"
        if not ed25519.verifies(key, sig, SIGNOFF_DOMAIN + message):
            return f"{by}: bad signature"
        return None
    if a.get("alg", "hmac-sha256") != "hmac-sha256":
        return f"{by}: key {key_id!r} is an HMAC key but the approval says {a.get('alg')!r}"
    want = hmac.new(key, message, hashlib.sha256).hexdigest()
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
    keys: Mapping[str, TrustedKey],
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
    keys: Mapping[str, TrustedKey],
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


def trusted(signing: Any) -> dict[str, TrustedKey]:
    """What verifies approvals and certificates: the HMAC ring and ``signing.public_keys``."""
    _, ring = key_ring(signing)
    return ed25519.trusted_keys(ring, ed25519.public_ring(signing.public_keys))


def signing_key(signing: Any, key_file: Path | None = None) -> tuple[str, SigningKey]:
    """(key id, key) that signs an approval or a certificate now.

    ``key_file`` (a command's ``--key``), else ``signing.private_key_file``: an Ed25519
    private key. Neither: the ring's active HMAC key.
    """
    path = key_file or signing.private_key_file
    if path is not None:
        key = ed25519.load_private(Path(path))
        return ed25519.key_id(key.public_key()), key
    key_id, keys = key_ring(signing)
    if key_id not in keys:
        raise ConfigError(f"active signing key {key_id!r} is not in the key ring")
    return key_id, keys[key_id]


def read_approvals(report: Path) -> list[dict[str, Any]]:
    path = sidecar(report)
    if not path.exists():
        return []
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path}: {exc}") from exc
    return list(data.get("approvals", []))
