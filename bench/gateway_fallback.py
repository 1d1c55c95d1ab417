"""Fallback rate of the gateway's JSON guard on the lab's real JSON answers, per precision.

Each JSON-task answer the lab recorded (candidate variants and the reference) is
streamed through the gateway's incremental guard exactly as the gateway would
(token-sized chunks, then the close): an answer the guard cuts is a silent retry
on the next precision. This is the per-precision fallback rate users would cause
on these prompts; no server is needed because the answers are recorded.

    python bench/gateway_fallback.py [--pairs PAIRS.jsonl.gz] [--json] [--write BENCHMARKS.md]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter, defaultdict
from pathlib import Path

from common import write_section

from quantdrift.demo.sources import read_pairs
from quantdrift.gateway.json_guard import guard_for
from quantdrift.schemas import ModelOutput, PairEvent

SECTION = "## Gateway fallback rate on the lab's JSON prompts"


def guarded(output: ModelOutput, pair: PairEvent) -> str | None:
    """None when the guard lets the streamed answer through, else the reason it cut it."""
    guard = guard_for(
        expected_keys=pair.request.expected_keys, json_schema=pair.request.json_schema
    )
    chunks = output.tokens or [output.text]
    for chunk in chunks:
        result = guard.feed(chunk)
        if not result.ok:
            return result.reason
    result = guard.close()
    return None if result.ok else result.reason


def measure(pairs: list[PairEvent]) -> dict[str, dict[str, object]]:
    """Per precision: answers seen, cut by the guard, and why."""
    seen: dict[str, set[str]] = defaultdict(set)
    cut: Counter[str] = Counter()
    total: Counter[str] = Counter()
    reasons: dict[str, Counter[str]] = defaultdict(Counter)
    for pair in pairs:
        if not (pair.request.expects_json or pair.request.expected_keys):
            continue
        sides = [(pair.candidate.precision or "candidate", pair.candidate)]
        if pair.kind == "shadow":
            sides.append((pair.reference.precision or "reference", pair.reference))
        for precision, output in sides:
            key = f"{pair.request.decoding}:{output.text}"
            if key in seen[precision]:  # the reference answers recur across variants
                continue
            seen[precision].add(key)
            total[precision] += 1
            reason = guarded(output, pair)
            if reason is not None:
                cut[precision] += 1
                reasons[precision][reason] += 1
    return {
        p: {
            "answers": total[p],
            "fallbacks": cut[p],
            "fallback_rate": round(cut[p] / total[p], 3) if total[p] else None,
            "reasons": dict(reasons[p].most_common()),
        }
        for p in sorted(total)
    }


def markdown(result: dict[str, dict[str, object]]) -> str:
    lines = [
        SECTION,
        "",
        "`python bench/gateway_fallback.py`: every JSON-task answer recorded by the lab "
        "(SmolLM2-135M, greedy and sampled), streamed token by token through the gateway's "
        "JSON guard; a cut answer is a silent retry on the next precision.",
        "",
        "| precision | JSON answers | cut by the guard | fallback rate | why |",
        "|---|---:|---:|---:|---|",
    ]
    for p, r in result.items():
        why = ", ".join(f"{k} {v}" for k, v in r["reasons"].items()) or "-"  # type: ignore[union-attr]
        rate = r["fallback_rate"]
        lines.append(
            f"| {p} | {r['answers']} | {r['fallbacks']} | "
            f"{'-' if rate is None else f'{rate:.0%}'} | {why} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=Path, default=None, help="default: the shipped lab pairs")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--write", type=Path, default=None)
    args = ap.parse_args(argv)
    result = measure(read_pairs(args.pairs))
    text = markdown(result)
    if args.write:
        write_section(args.write, text, SECTION)
    if args.json:
        sys.stdout.write(json.dumps({"bench": "gateway_fallback", "precisions": result}) + "\n")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
