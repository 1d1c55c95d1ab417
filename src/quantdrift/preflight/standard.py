"""The launch standard: the ten items the team signs, in its order and words, and
which of quantdrift's checks answers each.

The checks run in the order that measures best (``warmup`` first, on a cold
server: see ``runner``); the page shows them in the order people know from the
launch standard. An item whose check did not run, was skipped or was not
selected is *not run*, with why, and never reads as passed; a waived skip says
so and names the waiver. Checks beyond the standard (``perplexity``, one of the
product side's vetoes) follow the ten, under their own heading.

Pure: a report in, rows out.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

Shown = Literal["pass", "fail", "not run"]


@dataclass(frozen=True, slots=True)
class LaunchItem:
    number: int
    name: str  # as the team knows it
    check: str  # the check id that answers it
    asks: str  # what the standard asks, in one line


STANDARD = (
    LaunchItem(1, "Calibration-set leakage", "calibration-leakage",
               "the calibration set shares no items with the evaluation set"),
    LaunchItem(2, "Salient-weight protection", "salient-weights",
               "embeddings, lm_head and outlier layers keep high precision"),
    LaunchItem(3, "Long-context needle recall", "niah",
               "the candidate finds facts in long contexts as well as the reference"),
    LaunchItem(4, "FP8 scale ranges", "fp8-scales",
               "every scale tensor finite, non-zero and in range"),
    LaunchItem(5, "Kernel warm-up", "warmup",
               "the first request of each prompt length is not far slower than steady state"),
    LaunchItem(6, "Memory-utilisation bounds", "memory-utilization",
               "the engine's gpu_memory_utilization inside its bounds"),
    LaunchItem(7, "Shadow link and diff-engine latency", "shadow-link",
               "the intended share is mirrored, pairs are scored, scoring is fast"),
    LaunchItem(8, "Entropy and repetition probes", "probes",
               "the streaming probes and the JSON guard are on for the route"),
    LaunchItem(9, "One-second switch console", "switch-drill",
               "a rollback and a restore each reach the gateway in under a second"),
    LaunchItem(10, "Load test at 1.5x peak", "load",
               "no OOM, no stall, no error burst at 1.5 times the stated peak"),
)  # fmt: skip
BEYOND = (
    LaunchItem(11, "Domain perplexity", "perplexity",
               "teacher-forced perplexity on the route's domains close to the reference"),
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Row:
    """One line of the checklist as the page shows it."""

    item: LaunchItem
    shown: Shown
    why: str  # the check's own one-line reason, or why it did not run
    waiver: str | None
    veto: bool
    report_item: Mapping[str, Any] | None  # the report's item, None when the check did not run


def rows(report: Mapping[str, Any], items: tuple[LaunchItem, ...] = STANDARD) -> list[Row]:
    """The launch items in order, each with what the report says of it.

    >>> r = {"items": [{"id": "niah", "status": "pass", "evidence": {"why": "ok"}}],
    ...      "waivers": {"load": "staging has no peak"}, "vetoes": [], "subject": {}}
    >>> [(x.item.number, x.shown) for x in rows(r)][:3]
    [(1, 'not run'), (2, 'not run'), (3, 'pass')]
    >>> rows(r)[0].why
    'not selected in this run'
    >>> rows(r)[9].why, rows(r)[9].waiver
    ('not selected in this run', 'staging has no peak')
    """
    by_id = {i["id"]: i for i in report.get("items", [])}
    waivers = report.get("waivers") or {}
    vetoed = {v["id"] for v in report.get("vetoes", [])}
    out = []
    for li in items:
        it = by_id.get(li.check)
        waiver = waivers.get(li.check)
        if it is None:
            out.append(Row(li, "not run", "not selected in this run", waiver, False, None))
            continue
        ev = it.get("evidence") or {}
        why = str(ev.get("why") or ev.get("reason") or "")
        shown: Shown = "not run" if it["status"] == "skipped" else it["status"]
        out.append(Row(li, shown, why, waiver, li.check in vetoed, it))
    return out


def beyond(report: Mapping[str, Any]) -> list[Row]:
    """Checks the report holds beyond the standard (only those that ran)."""
    return [r for r in rows(report, BEYOND) if r.report_item is not None]
