"""A report on disk is verified by one function: unreadable files fail with their reason."""

from __future__ import annotations

import json
from pathlib import Path

from quantdrift.schemas.signoff import approve, sidecar, verify_file

KEYS = {"ops": b"ops-signoff-key-of-at-least-32-bytes"}


def write_report(tmp_path: Path, verdict: str, signers: tuple[str, ...]) -> Path:
    report = tmp_path / "report.json"
    raw = json.dumps({"verdict": verdict, "items": []}).encode()
    report.write_bytes(raw)
    approvals = [approve(raw, by, "ops", KEYS["ops"], 1.0) for by in signers]
    sidecar(report).write_text(json.dumps({"approvals": approvals}))
    return report


def test_a_go_report_with_two_signers_verifies(tmp_path: Path) -> None:
    result = verify_file(write_report(tmp_path, "go", ("ana", "bo")), KEYS)
    assert result.ok and result.verdict == "go" and result.signers == ["ana", "bo"]
    assert not verify_file(write_report(tmp_path, "go", ("ana", "bo")), KEYS, required=3).ok
    # One key for both names: --distinct-keys counts keys, not names.
    assert not verify_file(tmp_path / "report.json", KEYS, distinct_keys=True).ok


def test_a_missing_report_fails_with_its_path(tmp_path: Path) -> None:
    missing = tmp_path / "none.json"
    result = verify_file(missing, KEYS)
    assert not result.ok and result.verdict is None and result.signers == []
    assert result.problems == [f"{missing}: No such file or directory"]


def test_an_unreadable_sidecar_fails_with_its_reason(tmp_path: Path) -> None:
    report = write_report(tmp_path, "go", ("ana", "bo"))
    sidecar(report).write_text("{not json")
    result = verify_file(report, KEYS)
    assert not result.ok and len(result.problems) == 1
    assert result.problems[0].startswith(f"{sidecar(report)}: ")


def test_no_go_is_never_verified(tmp_path: Path) -> None:
    result = verify_file(write_report(tmp_path, "no-go", ("ana", "bo")), KEYS)
    assert not result.ok and "verdict is 'no-go', not 'go'" in result.problems
