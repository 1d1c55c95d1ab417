"""Route decisions per scorer: does the tiered scorer decide as MiniLM on every pair does?

    python bench/decisions.py [--small] [--streams K --length N] [--modes greedy/full,...]
                              [--embedders minilm,tiered,static] [--json] [--write BENCHMARKS.md]

For each mode (greedy / sampled decoding x log-probs full / no-teacher-forcing /
none) it runs ``quantdrift eval``'s service (:func:`quantdrift.services.evaluation.run_eval`,
the same call the CLI makes, through ``eval_modes.py``'s per-mode run) with each
scorer, on the shipped lab pairs, with the protocol of docs/deciding.md::

    --healthy P --healthy-label int8 --drifted P --drifted-label int4,int3,int2
    --calibrate P --blessed-label int8 --holdout --decoding D --logprobs L
    --streams S --length N --seed 1

and the production policy (``default``). Per scorer it reports false rollbacks on
the healthy streams and, per broken variant, the detection delay (median of the
streams that caught it, p90 with a missed stream counted as ``drift_length + 1``)
and how many streams missed it. Every scorer sees the same seeded draws, so the
rows differ by the scores alone.

The question asked of the tiered scorer (issue 21): in every mode, 0 false
rollbacks and every delay within 10 % of MiniLM's, read both ways
(``|tiered / minilm - 1| <= 0.10``; a variant neither calls counts as equal, one
that only one of them calls does not). ``static`` is there for reference: what
the tiered scorer would decide without escalating. ``tiered-bf16`` is the tiered
scorer with MiniLM in bfloat16 (``embedding.dtype``), asked the same question
against float32 MiniLM; ``minilm-bf16`` (bf16 on every pair) can be asked for too.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import eval_modes
from common import machine, write_section

SECTION = "## Decisions per scorer: tiered against MiniLM (bench/decisions.py)"
MODES = tuple(f"{d}/{lp}" for d, lp in eval_modes.MODES)
EMBEDDERS = ("minilm", "tiered", "static", "tiered-bf16")
KNOWN = (*EMBEDDERS, "minilm-bf16")
# Each compared with MiniLM everywhere (float32): the question of the module docstring.
COMPARED = ("tiered", "tiered-bf16", "minilm-bf16")
VARIANTS = ("int4", "int3", "int2")
TOLERANCE = 0.10
SIZES = {"default": (20, 5000), "small": (2, 300)}


def run_mode(mode: str, embedder: str, streams: int, length: int, seed: int) -> dict[str, Any]:
    """One ``quantdrift eval`` of a mode on the lab pairs with one scorer, reduced to the
    decision: eval_modes.py's run (the service the CLI calls) and its summary."""
    decoding, logprobs = mode.split("/")
    path, variants = eval_modes.SETS["lab"]
    tier, _, dtype = embedder.partition("-")
    # One calibration, the whole calibration set: the scorers are compared on the same
    # floors, so the rows differ by the scores alone.
    args = argparse.Namespace(
        embedder=tier,
        dtype={"bf16": "bfloat16"}.get(dtype, "float32"),
        streams=streams,
        length=length,
        seed=seed,
        calibration_draws=1,
    )
    t0 = time.perf_counter()
    summary = eval_modes.summarise(eval_modes.run_mode(path, variants, decoding, logprobs, args))
    return {
        "false_rollbacks": summary["false_rollbacks"],
        "healthy_pairs": summary["healthy_pairs"],
        "delay": {
            v: {"median": d["median"], "p90": d["p90"], "missed": d["missed"]}
            for v, d in summary["delays"].items()
        },
        "seconds": round(time.perf_counter() - t0, 1),
    }


def _ratio(tiered: float | None, minilm: float | None) -> float | None:
    if tiered is None or minilm is None or minilm == 0:
        return None
    return round(tiered / minilm, 4)


def compare(tiered: dict[str, Any], minilm: dict[str, Any]) -> dict[str, Any]:
    """Tiered against MiniLM in one mode: 0 false rollbacks, each delay within 10 %."""
    ratios: dict[str, dict[str, float | None]] = {}
    within = True
    for variant, want in minilm["delay"].items():
        got = tiered["delay"].get(variant, {})
        ratios[variant] = {}
        for stat in ("median", "p90"):
            t, m = got.get(stat), want[stat]
            ratio = _ratio(t, m)
            ratios[variant][stat] = ratio
            if t is None and m is None:
                continue  # neither calls it: the same decision
            if t is None or m is None or not m * (1 - TOLERANCE) <= t <= m * (1 + TOLERANCE):
                within = False
        within = within and got.get("missed") == want["missed"]
    zero = tiered["false_rollbacks"] == 0
    return {
        "delay_ratio": ratios,
        "within_10pct": within,
        "zero_false_rollbacks": zero,
        "equivalent": within and zero,
    }


def run(
    modes: Sequence[str], embedders: Sequence[str], streams: int, length: int, seed: int
) -> dict[str, Any]:
    started = time.perf_counter()
    out: dict[str, Any] = {}
    for mode in modes:
        per = {e: run_mode(mode, e, streams, length, seed) for e in embedders}
        for name in COMPARED:
            if name in per and "minilm" in per:
                per[f"{name}_vs_minilm"] = compare(per[name], per["minilm"])
        out[mode] = per
        print(f"{mode}: " + _line(per), flush=True)
    everywhere = {}
    for name in COMPARED:
        compared = [m[f"{name}_vs_minilm"] for m in out.values() if f"{name}_vs_minilm" in m]
        if compared:
            everywhere[name] = all(c["equivalent"] for c in compared)
    return {
        "modes": out,
        "tiered_equivalent_everywhere": everywhere.get("tiered", False),
        "equivalent_everywhere": everywhere,
        "size": {"streams": streams, "length": length, "seed": seed},
        "protocol": "docs/deciding.md (--holdout, int8 healthy and blessed, int4/int3/int2)",
        "machine": machine(),
        "seconds": round(time.perf_counter() - started, 1),
    }


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:g}"


def _line(per: dict[str, Any]) -> str:
    parts = []
    for name, r in per.items():
        if name.endswith("_vs_minilm"):
            parts.append(f"{name.removesuffix('_vs_minilm')} equivalent {r['equivalent']}")
            continue
        delays = " ".join(
            f"{v} {_fmt(d['median'])}/{_fmt(d['p90'])}" for v, d in r["delay"].items()
        )
        parts.append(f"{name}: fr {r['false_rollbacks']}, {delays}")
    return "; ".join(parts)


def _markdown(result: dict[str, Any]) -> str:
    size = result["size"]
    m = result["machine"]
    lines = [
        SECTION,
        "",
        f"`python bench/decisions.py --streams {size['streams']} --length {size['length']}`: "
        "`quantdrift eval`'s service on the lab pairs with each scorer, the protocol of "
        "docs/deciding.md (held-out prompts, int8 healthy and blessed, seed "
        f"{size['seed']}), the default policy. Delay in drifted pairs, median / p90 "
        "(a missed stream counts as the drift length + 1); FR: false rollbacks over "
        f"{size['streams'] * size['length']} healthy pairs. Machine: {m['nproc']} cores, "
        f"{m['cpu']}.",
        "",
        "| mode | scorer | FR | " + " | ".join(f"{v} delay | {v} missed" for v in VARIANTS) + " |",
        "|---|---|---:|" + "---:|---:|" * len(VARIANTS),
    ]
    for mode, per in result["modes"].items():
        for name in KNOWN:
            r = per.get(name)
            if r is None:
                continue
            cells = []
            for v in VARIANTS:
                d = r["delay"].get(v)
                cells += (
                    ["-", "-"]
                    if d is None
                    else [
                        f"{_fmt(d['median'])} / {_fmt(d['p90'])}",
                        str(d["missed"]),
                    ]
                )
            lines.append(
                f"| {mode} | {name} | {r['false_rollbacks']} | " + " | ".join(cells) + " |"
            )
    lines += [
        "",
        "Each scorer against MiniLM everywhere, float32 (0 false rollbacks, every delay "
        "within 10 %, the same misses):",
        "",
    ]
    lines += [
        "| mode | scorer | "
        + " | ".join(f"{v} median / p90 ratio" for v in VARIANTS)
        + " | equivalent |"
    ]
    lines += ["|---|---|" + "---:|" * len(VARIANTS) + "---|"]
    for mode, per in result["modes"].items():
        for name in COMPARED:
            c = per.get(f"{name}_vs_minilm")
            if c is None:
                continue
            cells = [
                f"{_fmt(c['delay_ratio'].get(v, {}).get('median'))} / "
                f"{_fmt(c['delay_ratio'].get(v, {}).get('p90'))}"
                for v in VARIANTS
            ]
            failed = [
                x
                for x, ok in (
                    ("false rollbacks", c["zero_false_rollbacks"]),
                    ("delays", c["within_10pct"]),
                )
                if not ok
            ]
            verdict = "**yes**" if c["equivalent"] else "no: " + ", ".join(failed)
            lines.append(f"| {mode} | {name} | " + " | ".join(cells) + f" | {verdict} |")
    lines.append("")
    for name, ok in result.get("equivalent_everywhere", {}).items():
        lines.append(f"{name} decides as MiniLM in every mode: **{'yes' if ok else 'no'}**.")
        lines.append("")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", action="store_true", help="a smoke size: 2 streams of 300 pairs")
    ap.add_argument("--streams", type=int, default=None)
    ap.add_argument("--length", type=int, default=None)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--modes", default=",".join(MODES), help="comma-separated decoding/logprobs")
    ap.add_argument("--embedders", default=",".join(EMBEDDERS))
    ap.add_argument("--json", action="store_true", help="end with one JSON object")
    ap.add_argument("--write", type=Path, default=None, help="write/update a section in this file")
    args = ap.parse_args(argv)
    streams, length = SIZES["small" if args.small else "default"]
    streams = args.streams or streams
    length = args.length or length
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    embedders = [e.strip() for e in args.embedders.split(",") if e.strip()]
    unknown = [m for m in modes if m not in MODES] + [e for e in embedders if e not in KNOWN]
    if unknown:
        ap.error(f"unknown mode or embedder: {', '.join(unknown)}")
    result = run(modes, embedders, streams, length, args.seed)
    if args.write:
        write_section(args.write, _markdown(result), SECTION)
        print(f"wrote {args.write}")
    if args.json:
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
