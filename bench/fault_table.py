"""The fault table of ``make bench-faults``: one row per case of the long schedule.

``tests/faults/test_fault_schedule.py --fault-schedule long --fault-rows FILE`` appends
one JSON line per case (what it expected, what it observed in the fault's window,
what the end-of-run checker accounted for, the time to recover, any breach). This
renders them as a Markdown table and, with ``--write``, replaces the "Fault schedule"
section of BENCHMARKS.md.

    python bench/fault_table.py ROWS.jsonl [--write BENCHMARKS.md] [--seed N] [--note TEXT]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import write_section

MARKER = "## Fault schedule"


def last_runs(runs: list[dict[str, object]]) -> list[dict[str, object]]:
    """Each case's last run, in the order the cases first ran."""
    return list({str(r["case"]): r for r in runs}.values())


def breaches(row: dict[str, object]) -> str:
    """The row's breaches, one line each (the log tails a failed case carries left out)."""
    found = [str(v).splitlines()[0] for v in row["violations"]]  # type: ignore[attr-defined]
    return "; ".join(v for v in found if not v.startswith("---"))


def held(row: dict[str, object]) -> str:
    """The hold, and the machine's 1-minute load average as the fault began and ended."""
    load = f", load {row['load']}" if row.get("load") else ""
    return f"{float(row['hold_s']):.0f} s{load}"  # type: ignore[arg-type]


def restarted(row: dict[str, object]) -> str:
    """The supervisor's restarts of the worker (rows of older runs have none recorded)."""
    found = [str(v) for v in row.get("restarts", [])]  # type: ignore[attr-defined]
    return "; ".join(found) or "none"


def cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render(runs: list[dict[str, object]], seed: int | None, note: str = "") -> str:
    """One row per case: its last run; an earlier run of the same case is listed below
    the table with what it breached, so a rerun never hides a first failure."""
    rows = last_runs(runs)
    earlier = [r for r in runs if not any(r is x for x in rows)]
    passed = sum(1 for r in rows if not r["violations"])
    lines = [
        MARKER,
        "",
        f"`make bench-faults` (seed {seed}): {len(rows)} cases on the multi-host rig, "
        f"{passed} with no breach. Each fault held for the time shown under the openai "
        "SDK's load (10 requests/s, every one mirrored); recovery is from healing until "
        "judging moves again and the gateway holds the route's newest epoch. A worker "
        "that exits is started again by the rig's supervisor, as systemd or Kubernetes "
        "would; each restart is listed with the exit status. "
        "How to run it and what each case means: docs/testing.md.",
        *(["", note] if note else []),
        "",
        "| case | expected | observed | pairs accounted | recover | worker restarts | breaches |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        observed = "; ".join(str(o) for o in r["observed"])  # type: ignore[attr-defined]
        recover = "—" if r["recover_s"] is None else f"{r['recover_s']} s"
        lines.append(
            f"| {r['case']} ({held(r)}) | {cell(str(r['expected']))} | "
            f"{cell(observed)} | {cell(str(r['accounted']))} | {recover} | "
            f"{cell(restarted(r))} | {cell(breaches(r)) or 'none'} |"
        )
    if earlier:
        lines += ["", "Earlier runs of a case (the table shows its last run):", ""]
        for r in earlier:
            lines.append(f"- {r['case']} ({held(r)}): {breaches(r) or 'no breach'}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("rows", type=Path)
    ap.add_argument("--write", type=Path, default=None)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--note", default="", help="a paragraph on this run (its load, reruns)")
    args = ap.parse_args(argv)
    rows = [json.loads(line) for line in args.rows.read_text().splitlines() if line.strip()]
    table = render(rows, args.seed, args.note)
    print(table)
    if args.write is not None:
        write_section(args.write, table, MARKER)
    return 0 if rows and all(not r["violations"] for r in last_runs(rows)) else 1


if __name__ == "__main__":
    raise SystemExit(main())
