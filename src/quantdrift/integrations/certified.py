"""What a route's quantization certificate tells the verdict API. Pure but ``from_file``.

A rollout may start from a certificate (``quantdrift preflight certificate``): the
build it names passed a signed preflight and, maybe, a live run elsewhere. The
verdict API is given it per route (``--certificate ROUTE=CERT``) and reads it on
every call, checked with the trusted public keys alone (``schemas.certificate``):

=====================================  ===============================================
the certificate                        what it does to the route's verdict
=====================================  ===============================================
does not verify (forged, edited,       ``fail``, with why: a certificate that was given
untrusted issuer, version 1)           and does not hold is refused, never a pass
verifies, but names another route      ``fail``: it certifies another launch
or another build than the route's
candidate serves
verifies, same build                   the breaker's verdict, unchanged: a certificate
                                       never turns ``inconclusive`` into ``pass``
=====================================  ===============================================

The engine-change rule holds (``breaker/candidate.py``): the certificate names the
engine, version and model it was measured on. When the route's candidate is served
by the same model on another engine or version, the route's own evidence restarted
when the first pair of that engine arrived, and the route must re-arm before the
verdict can be ``pass``; the certificate says so in the reason, and never lends the
old engine's record to the new one. What the certificate does give the new rollout
is its start: Flagger's ``pre-rollout`` hook accepts a verified certificate for the
route where no preflight report is configured (the launch was already checked and
signed for this build), and the rollout then waits on the re-arm like any other.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quantdrift.integrations.verdict import RouteVerdict
from quantdrift.schemas.certificate import check
from quantdrift.schemas.certificate import engine_identity as identity
from quantdrift.schemas.ed25519 import TrustedKey


def _model(engine_identity: str | None) -> str | None:
    return engine_identity.rsplit("/", 1)[-1] if engine_identity else None


@dataclass(frozen=True, slots=True)
class Certified:
    """A route's certificate, checked now: ``refused`` says why it may not inform."""

    verified: bool
    refused: str
    key_id: str
    signers: tuple[str, ...]
    route: str | None
    certified_engine: str | None
    serving_engine: str | None
    note: str

    @property
    def engine_changed(self) -> bool:
        return bool(
            self.certified_engine
            and self.serving_engine
            and self.certified_engine != self.serving_engine
        )

    def as_json(self) -> dict[str, Any]:
        return {
            "verified": self.verified,
            "refused": self.refused or None,
            "key_id": self.key_id,
            "signers": list(self.signers),
            "route": self.route,
            "certified_engine": self.certified_engine,
            "serving_engine": self.serving_engine,
            "engine_changed": self.engine_changed,
            "note": self.note,
        }


def certified(
    raw: bytes | None,
    keys: Mapping[str, TrustedKey],
    route: str,
    serving_engine: str | None,
    problem: str = "",
) -> Certified:
    """Check a route's certificate bytes against what now serves the route (pure).

    ``raw`` None with ``problem``: the file could not be read (refused, with why).
    """
    if raw is None:
        return Certified(False, problem or "no certificate", "", (), None, None, serving_engine, "")
    c = check(raw, keys)
    payload = c.payload or {}
    cert_engine = identity((payload.get("engine") or {}).get("candidate"))
    base = Certified(
        False, "", c.key_id, tuple(c.signers), payload.get("route"), cert_engine, serving_engine, ""
    )
    if not c.ok:
        return dataclasses.replace(base, refused="; ".join(c.problems))
    if payload.get("route") != route:
        return dataclasses.replace(
            base, refused=f"the certificate is for route {payload.get('route')!r}, not {route!r}"
        )
    if cert_engine and serving_engine and _model(cert_engine) != _model(serving_engine):
        return dataclasses.replace(
            base,
            refused=f"the certificate is for {cert_engine}; the route's candidate is "
            f"{serving_engine}, another build",
        )
    if cert_engine and serving_engine and cert_engine != serving_engine:
        note = f"same build certified on {cert_engine}; now served by {serving_engine}"
    elif serving_engine is None:
        note = "certified; no pair has said which engine serves the candidate yet"
    else:
        note = f"certified on {cert_engine or 'an engine it did not name'}"
    return dataclasses.replace(base, verified=True, note=note)


def inform(verdict: RouteVerdict, c: Certified) -> RouteVerdict:
    """The route's verdict with its certificate (the table in the module docstring)."""
    if not c.verified:
        return dataclasses.replace(
            verdict,
            verdict="fail",
            reason=f"certificate refused: {c.refused}",
            certificate=c.as_json(),
        )
    note = c.note
    if c.engine_changed:
        note += (
            ", whose own pairs re-armed the route"
            if verdict.verdict == "pass"
            else ": a new engine version, so the route's evidence restarted and it must re-arm"
        )
    return dataclasses.replace(
        verdict, reason=f"{verdict.reason}; {note}", certificate={**c.as_json(), "note": note}
    )


def from_file(
    path: Path, keys: Mapping[str, TrustedKey], route: str, serving_engine: str | None
) -> Certified:
    """``certified`` of the certificate at ``path``, re-read now; unreadable is refused."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        return certified(None, keys, route, serving_engine, f"{path}: {exc.strerror or exc}")
    return certified(raw, keys, route, serving_engine)
