"""The preflight report: one object, and the pure rule that turns items into go / no-go.

``{verdict, items: [{id, title, status, measured, threshold, evidence}], vetoes}``.

Why the rule is strict: a launch checklist exists because people skip steps
under pressure, so a check that could not run (``skipped``) never counts as a
pass. The only way past a skip is a named waiver in the YAML, with its reason,
which the report carries so the sign-off reads it. Vetoes are the product
side's hard stops (``niah``, ``perplexity`` by default): a failing vetoed item
is listed in ``vetoes`` as well, so a reader sees at once *why* it is no-go.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

Status = Literal["pass", "fail", "skipped"]
Verdict = Literal["go", "no-go"]

REPORT_VERSION = 1
DEFAULT_VETO_CHECKS = ("niah", "perplexity")


@dataclass(frozen=True, slots=True)
class Item:
    """The outcome of one check.

    ``measured`` and ``threshold`` are small JSON-able dicts (the numbers a
    reviewer compares); ``evidence`` holds what backs them (per-case rows,
    series for plots, reasons).
    """

    id: str
    title: str
    status: Status
    measured: dict[str, Any] = field(default_factory=dict)
    threshold: dict[str, Any] = field(default_factory=dict)
    evidence: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "title": self.title,
            "status": self.status,
            "measured": self.measured,
            "threshold": self.threshold,
            "evidence": self.evidence,
        }


def passed(
    id: str, title: str, measured: dict[str, Any], threshold: dict[str, Any], **ev: Any
) -> Item:
    return Item(id, title, "pass", measured, threshold, dict(ev))


def failed(
    id: str, title: str, measured: dict[str, Any], threshold: dict[str, Any], **ev: Any
) -> Item:
    return Item(id, title, "fail", measured, threshold, dict(ev))


def skipped(id: str, title: str, reason: str, **ev: Any) -> Item:
    """A check that could not run here; ``reason`` says why (never a pass)."""
    return Item(id, title, "skipped", {}, {}, {"reason": reason, **ev})


def judged(
    id: str, title: str, ok: bool, measured: dict[str, Any], threshold: dict[str, Any], **ev: Any
) -> Item:
    return Item(id, title, "pass" if ok else "fail", measured, threshold, dict(ev))


@dataclass(frozen=True, slots=True)
class Decision:
    verdict: Verdict
    vetoes: list[dict[str, str]]
    blocking: list[str]


def decide(
    items: Sequence[Item],
    veto_checks: Sequence[str] = DEFAULT_VETO_CHECKS,
    waivers: Mapping[str, str] | None = None,
) -> Decision:
    """``go`` only when every item passed, or was skipped under a named waiver.

    Examples
    --------
    >>> ok = Item("niah", "NIAH", "pass")
    >>> decide([ok]).verdict
    'go'
    >>> decide([ok, Item("warmup", "Warm-up", "skipped")]).blocking
    ['warmup: skipped (a skip is never a pass)']
    >>> decide([Item("niah", "NIAH", "fail", evidence={"why": "recall 0.5 < 0.8"})]).vetoes
    [{'id': 'niah', 'reason': 'recall 0.5 < 0.8'}]
    >>> decide([]).verdict  # nothing checked is nothing proven
    'no-go'
    """
    waivers = waivers or {}
    vetoes: list[dict[str, str]] = []
    blocking: list[str] = []
    if not items:
        blocking.append("no check ran")
    for item in items:
        if item.status == "fail":
            why = str(item.evidence.get("why", "failed"))
            blocking.append(f"{item.id}: {why}")
            if item.id in veto_checks:
                vetoes.append({"id": item.id, "reason": why})
        elif item.status == "skipped" and item.id not in waivers:
            blocking.append(f"{item.id}: skipped (a skip is never a pass)")
    return Decision("no-go" if blocking else "go", vetoes, blocking)


def build_report(
    items: Sequence[Item],
    *,
    veto_checks: Sequence[str] = DEFAULT_VETO_CHECKS,
    waivers: Mapping[str, str] | None = None,
    subject: Mapping[str, Any] | None = None,
    generated_at: float | None = None,
) -> dict[str, Any]:
    """The report object (what is written, signed and verified)."""
    decision = decide(items, veto_checks, waivers)
    return {
        "report_version": REPORT_VERSION,
        "verdict": decision.verdict,
        "items": [i.as_dict() for i in items],
        "vetoes": decision.vetoes,
        "blocking": decision.blocking,
        "waivers": dict(waivers or {}),
        "subject": dict(subject or {}),
        "generated_at": generated_at,
    }


def report_bytes(report: Mapping[str, Any]) -> bytes:
    """The exact bytes written to disk: what sign and verify hash."""
    return (json.dumps(report, indent=2, ensure_ascii=False, allow_nan=False) + "\n").encode()


def summary_lines(report: Mapping[str, Any]) -> list[str]:
    """A human table for stderr: one line per item, then the verdict."""
    lines = []
    for item in report["items"]:
        why = item["evidence"].get("why") or item["evidence"].get("reason") or ""
        lines.append(f"  {item['status']:<8} {item['id']:<20} {why}")
    lines.append(f"verdict: {report['verdict']}")
    for v in report["vetoes"]:
        lines.append(f"  veto {v['id']}: {v['reason']}")
    return lines
