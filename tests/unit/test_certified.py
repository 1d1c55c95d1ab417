"""What a route's certificate does to the verdict (integrations/certified.py), as a table,
and the trusted keys the settings give (schemas/signoff.trusted). Pure.

Across the seams (the verdict API process, the breaker's store, a rollout on a new
engine version): tests/integration/test_certificate_reuse.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from quantdrift.breaker.policy import RoutePolicy
from quantdrift.breaker.state import RouteState
from quantdrift.config import SigningSettings
from quantdrift.errors import ConfigError
from quantdrift.integrations.certified import certified, from_file, inform
from quantdrift.integrations.verdict import route_verdict
from quantdrift.preflight.certificate import keygen
from quantdrift.preflight.report import Item, build_report, report_bytes
from quantdrift.schemas import certificate as cert
from quantdrift.schemas import ed25519
from quantdrift.schemas.signoff import approve, trusted

ISSUER, ALICE, BOB = ed25519.generate(), ed25519.generate(), ed25519.generate()
KEYS = {ed25519.key_id(k.public_key()): k.public_key() for k in (ISSUER, ALICE, BOB)}
ROUTE, OLD, NEW = "r/int4", "vllm/0.31.0/smol", "vllm/0.32.0/smol"


def _cert(route: str = ROUTE) -> bytes:
    engines = {"candidate": {"engine": "vllm", "version": "0.31.0", "model": "smol"}}
    raw = report_bytes(
        build_report([Item("probes", "P", "pass")], subject={"route": route, "engines": engines})
    )
    approvals = [approve(raw, "alice", "", ALICE, 1.0), approve(raw, "bob", "", BOB, 2.0)]
    env = cert.issue(raw, approvals, required=2, distinct_keys=False, key=ISSUER, issued_at=3.0)
    return json.dumps(env).encode()


def _verdict(pairs: int) -> object:
    state = RouteState(pairs_seen=pairs, candidate_engine=NEW if pairs else "")
    return route_verdict(ROUTE, state, 1 if pairs else 0, RoutePolicy(rules=("consecutive",),
                         min_pairs=5), None, {})  # fmt: skip


@pytest.mark.parametrize(
    ("raw", "serving", "pairs", "verdict", "in_reason"),
    [
        # Verified, same engine: the breaker's verdict stands.
        (_cert(), OLD, 5, "pass", "certified on vllm/0.31.0/smol"),
        # Verified, new engine version: still warming, and said so; re-armed later.
        (_cert(), NEW, 1, "inconclusive", "evidence restarted and it must re-arm"),
        (_cert(), NEW, 5, "pass", "whose own pairs re-armed the route"),
        # Refused: edited, another route, another build.
        (_cert().replace(b"0.31.0", b"0.30.0"), OLD, 5, "fail", "certificate refused: bad sig"),
        (_cert("other/int4"), OLD, 5, "fail", "is for route 'other/int4'"),
        (_cert(), "vllm/0.32.0/bigger", 5, "fail", "another build"),
    ],
)
def test_what_a_certificate_does_to_the_verdict(
    raw: bytes, serving: str, pairs: int, verdict: str, in_reason: str
) -> None:
    before = _verdict(pairs)
    after = inform(before, certified(raw, KEYS, ROUTE, serving))  # type: ignore[arg-type]
    assert after.verdict == verdict and in_reason in after.reason, after.reason
    assert after.certificate is not None and after.as_json("")["certificate"] == after.certificate
    if verdict != "fail":  # a certificate never upgrades a verdict
        assert after.verdict == before.verdict  # type: ignore[attr-defined]


def test_an_unreadable_certificate_is_refused(tmp_path: Path) -> None:
    c = from_file(tmp_path / "missing.json", KEYS, ROUTE, OLD)
    assert not c.verified and "No such file" in c.refused


def test_trusted_keys_from_settings(tmp_path: Path) -> None:
    key_id = keygen(tmp_path / "alice.pem")
    assert key_id.startswith(ed25519.PREFIX)
    assert oct((tmp_path / "alice.pem").stat().st_mode & 0o777) == "0o600"
    with pytest.raises(ConfigError, match="refusing to overwrite"):
        keygen(tmp_path / "alice.pem")
    signing = SigningSettings(public_keys=[tmp_path / "alice.pem.pub"])
    keys = trusted(signing)
    assert isinstance(keys[key_id], ed25519.PublicKey) and isinstance(keys["dev"], bytes)
    with pytest.raises(ConfigError, match="may not start with 'ed25519:'"):
        trusted(SigningSettings(keys={"ed25519:x": "a-secret"}))  # type: ignore[dict-item]
    with pytest.raises(ConfigError, match="not a PEM public key"):
        trusted(SigningSettings(public_keys=[tmp_path / "alice.pem"]))
