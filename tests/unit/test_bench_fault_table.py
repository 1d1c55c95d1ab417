"""bench/fault_table.py: one row per case (its last run), earlier runs listed with their
breaches, the log tails a failed case carries left out, and a failing exit status."""

from __future__ import annotations

import json
from pathlib import Path

import fault_table


def run(case: str, violations: list[str]) -> dict[str, object]:
    return {
        "case": case,
        "expected": "users served | counted",
        "observed": ["dropped 5 packets gateway->redis"],
        "accounted": "10 mirrored: 10 judged",
        "recover_s": 0.4,
        "violations": violations,
        "seconds": 60.0,
        "hold_s": 120.0,
    }


def test_a_rerun_shows_last_and_keeps_the_first_failure_listed(tmp_path: Path) -> None:
    rows = tmp_path / "rows.jsonl"
    runs = [
        run("a", ["users saw {503: 1}", "--- worker log ---\nlines"]),
        run("b", []),
        run("a", []),
    ]
    rows.write_text("".join(json.dumps(r) + "\n" for r in runs))
    out = tmp_path / "BENCHMARKS.md"
    assert fault_table.main([str(rows), "--seed", "7", "--write", str(out)]) == 0
    text = out.read_text()
    assert "2 cases on the multi-host rig, 2 with no breach" in text
    assert text.count("| a (120 s) |") == 1 and "users served \\| counted" in text
    assert "- a (120 s): users saw {503: 1}" in text
    assert "worker log" not in text


def test_a_breach_fails_the_run(tmp_path: Path) -> None:
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps(run("a", ["two commands for one epoch: [20]"])) + "\n")
    assert fault_table.main([str(rows)]) == 1


def test_a_row_shows_its_hold_load_and_the_workers_restarts(tmp_path: Path) -> None:
    rows = tmp_path / "rows.jsonl"
    restarted = {
        **run("worker-broker", []),
        "load": "3.1-4.2",
        "restarts": ["the worker exited 70 at +62.0s of the fault, restarted 1.0s later"],
    }
    rows.write_text(json.dumps(restarted) + "\n" + json.dumps(run("b", [])) + "\n")
    out = tmp_path / "BENCHMARKS.md"
    assert fault_table.main([str(rows), "--write", str(out)]) == 0
    text = out.read_text()
    assert "| worker-broker (120 s, load 3.1-4.2) |" in text
    assert "| the worker exited 70 at +62.0s of the fault, restarted 1.0s later | none |" in text
    assert "| b (120 s) |" in text and "| 0.4 s | none | none |" in text
