"""Needle recall per context length x language, for several builds, from running engines.

    python bench/niah_table.py --reference URL --candidate int8=URL --candidate int3=URL \
        [--lengths 4096,8192] [--languages en,zh,ja] [--floor 0.9 --tolerance 0.05] \
        [--per-cell 2] [--out DIR] [--json]

One ``quantdrift preflight --only niah`` run per candidate against the one reference
(the real CLI: the same haystacks, per-cell judgement and veto as a launch), then one
table with a row per (language, length) cell and a column per build: candidate recall /
reference recall, the prompt tokens the server counted, and ``VETO`` on a cell that
stops the launch (under the floor, or behind the reference by more than the
tolerance). Without ``--lengths`` the haystacks come from the servers' context
(``/v1/models``'s ``max_model_len``: a quarter, a half and the whole window less room
for the question), so on vLLM the table reaches the model's context. Each engine's model
name is read from its ``/v1/models`` unless ``NAME=URL@MODEL`` gives it.

It starts nothing: the engines are running (``quantdrift lab vllm`` or ``lab serve``).
Prints the table (Markdown); ``--json`` ends with one object ``{"cells": {build: [...]},
"verdicts": {build: ...}, "wall_s": ...}``. Reports go to ``--out`` (default: a
temporary folder), one ``niah-BUILD.json`` with its launch page beside it.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx
import yaml


def engine(spec: str) -> tuple[str, str, str | None]:
    """``NAME=URL`` or ``NAME=URL@MODEL`` -> (name, url, model or None).

    >>> engine("int8=http://127.0.0.1:8001@smol-int8")
    ('int8', 'http://127.0.0.1:8001', 'smol-int8')
    >>> engine("int3=http://h:8002")
    ('int3', 'http://h:8002', None)
    """
    name, sep, rest = spec.partition("=")
    if not sep or not name or not rest.startswith("http"):
        raise argparse.ArgumentTypeError(f"expected NAME=URL[@MODEL], got {spec!r}")
    url, _, model = rest.partition("@")
    return name, url.rstrip("/"), model or None


def served_model(url: str) -> str | None:
    """The first model a server lists on ``/v1/models`` (None when it lists none)."""
    try:
        data = httpx.get(f"{url}/v1/models", timeout=10).json().get("data") or []
    except (httpx.HTTPError, ValueError, AttributeError):
        return None
    return str(data[0]["id"]) if data and isinstance(data[0], dict) else None


def table(cells: Mapping[str, Sequence[Mapping[str, Any]]], vetoed: Mapping[str, set]) -> str:
    """The Markdown table: a row per (language, length), a column per build (pure).

    >>> print(table({"int8": [{"language": "en", "length": 256, "candidate": 1.0,
    ...     "reference": 1.0, "prompt_tokens": 280}], "int3": [{"language": "en",
    ...     "length": 256, "candidate": 0.25, "reference": 1.0, "prompt_tokens": 280}]},
    ...     {"int8": set(), "int3": {("en", 256)}}))
    | cell | prompt tokens | int8 | int3 |
    |---|---|---|---|
    | en, 256 | 280 | 100 % / 100 % | 25 % / 100 % VETO |
    """
    builds = list(cells)
    keys = sorted({(c["language"], int(c["length"])) for b in builds for c in cells[b]},
                  key=lambda k: (k[1], k[0]))  # fmt: skip
    at = {(b, c["language"], int(c["length"])): c for b in builds for c in cells[b]}
    lines = [f"| cell | prompt tokens | {' | '.join(builds)} |", "|---" * (len(builds) + 2) + "|"]
    for lang, n in keys:
        row, tokens = [], None
        for b in builds:
            c = at.get((b, lang, n))
            if c is None:
                row.append("–")
                continue
            tokens = tokens or c.get("prompt_tokens")
            mark = " VETO" if (lang, n) in vetoed.get(b, set()) else ""
            row.append(f"{c['candidate']:.0%} / {c['reference']:.0%}{mark}".replace("%", " %"))
        lines.append(f"| {lang}, {n:,} | {tokens or '?'} | {' | '.join(row)} |")
    return "\n".join(lines)


def run_niah(
    name: str, cand: tuple[str, str | None], ref: tuple[str, str | None], args: argparse.Namespace
) -> dict[str, Any]:
    """``quantdrift preflight --only niah`` for one build; its report."""
    section: dict[str, Any] = {"languages": args.languages, "per_cell": args.per_cell,
                               "floor": args.floor, "tolerance": args.tolerance}  # fmt: skip
    if args.lengths:
        section["lengths"] = args.lengths
    if args.depths:
        section["depths"] = args.depths
    config = args.out / f"niah-{name}.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "candidate": {"url": cand[0], "model": cand[1]},
                "reference": {"url": ref[0], "model": ref[1]},
                "route": f"niah/{name}",
                "vetoes": ["niah"],
                "niah": section,
            }
        )
    )
    report = args.out / f"niah-{name}.json"
    proc = subprocess.run(
        [sys.executable, "-m", "quantdrift", "preflight", "--config", str(config),
         "--only", "niah", "--json", "--quiet", "--report", str(report)],
        capture_output=True, text=True, timeout=args.timeout,
    )  # fmt: skip
    if proc.returncode not in (0, 1):
        raise SystemExit(f"niah for {name} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return json.loads(proc.stdout)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reference", required=True, help="URL[@MODEL] of the reference engine")
    ap.add_argument("--candidate", type=engine, action="append", required=True,
                    help="NAME=URL[@MODEL], repeatable: one column each")  # fmt: skip
    ap.add_argument("--lengths", type=lambda s: [int(x) for x in s.split(",")], default=None)
    ap.add_argument("--depths", type=lambda s: [float(x) for x in s.split(",")], default=None)
    ap.add_argument("--languages", type=lambda s: s.split(","), default=["en", "zh", "ja"])
    ap.add_argument("--per-cell", type=int, default=2, help="needles per depth and cell")
    ap.add_argument("--floor", type=float, default=0.9)
    ap.add_argument("--tolerance", type=float, default=0.05)
    ap.add_argument("--timeout", type=float, default=6 * 3600, help="seconds per build")
    ap.add_argument("--out", type=Path, default=None, help="folder for the reports")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    t0 = time.monotonic()
    _, ref_url, ref_model = engine(f"reference={args.reference}")
    ref = (ref_url, ref_model or served_model(ref_url))
    with tempfile.TemporaryDirectory(prefix="qd-niah-") as tmp:
        args.out = args.out or Path(tmp)
        args.out.mkdir(parents=True, exist_ok=True)
        reports = {
            name: run_niah(name, (url, model or served_model(url)), ref, args)
            for name, url, model in args.candidate
        }
    cells, vetoed, verdicts = {}, {}, {}
    for name, report in reports.items():
        item = next(i for i in report["items"] if i["id"] == "niah")
        cells[name] = item["evidence"].get("by_cell") or []
        bad = {(c["language"], int(c["length"])) for c in cells[name]
               if not _passes(c, args.floor, args.tolerance)}  # fmt: skip
        vetoed[name] = bad
        verdicts[name] = {"status": item["status"], "why": item["evidence"].get("why", ""),
                          "context_length": item["measured"].get("context_length")}  # fmt: skip
    print(table(cells, vetoed))
    for name, v in verdicts.items():
        print(f"{name}: niah {v['status']} (context {v['context_length']}): {v['why']}")
    if args.json:
        out = {"cells": cells, "verdicts": verdicts, "wall_s": round(time.monotonic() - t0, 1)}
        print(json.dumps(out))
    return 0


def _passes(cell: Mapping[str, Any], floor: float, tolerance: float) -> bool:
    """The launch's own per-cell judgement (``preflight.niah.judge``)."""
    from quantdrift.preflight.niah import judge

    return judge(cell["candidate"], cell["reference"], floor, tolerance)[0]


if __name__ == "__main__":
    raise SystemExit(main())
