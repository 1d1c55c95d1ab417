"""Route decisions per scorer: does the tiered scorer decide as MiniLM on every pair does?

    python bench/decisions.py [--corpus corpus/pairs] [--draws 100] [--calibration 300]
                              [--small] [--modes greedy/full,...]
                              [--embedders minilm,tiered,static] [--json] [--write BENCHMARKS.md]

For each mode (greedy / sampled decoding x log-probs full / no-teacher-forcing /
none) it runs the traffic corpus's evaluation (:mod:`quantdrift.services.corpus_eval`,
what ``quantdrift eval --no-replay`` and ``bench/eval_corpus.py`` run, read and split
as ``eval_corpus.py`` does) with each scorer: the prompts split once into a calibration
pool and an evaluation pool; per draw, ``--calibration`` prompts of the pool seed the
floors and the blessed int8 baseline, and a stream takes each evaluation prompt of the
mode's decoding at most once (the route carries that slice, ``--only decoding=D``),
int8 until a random onset, then the GPTQ int4 checkpoint or int3.

The production policy (``default``). Per scorer it reports false rollbacks on the
healthy streams and, per broken variant, the detection delay in route pairs (median of
the streams that caught it, p90 with a missed stream counted as the rest of its stream
+ 1) and how many streams missed it. Every scorer sees the same seeded draws, so the
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
from dataclasses import replace
from pathlib import Path
from typing import Any

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import eval_corpus
from common import machine, write_section

from quantdrift.config import EmbeddingSettings
from quantdrift.evaluation.corpus import CorpusEval
from quantdrift.services import corpus_eval
from quantdrift.services.corpus_eval import CorpusRequest

SECTION = "## Decisions per scorer: tiered against MiniLM (bench/decisions.py)"
LOGPROBS = ("full", "no-teacher-forcing", "none")
MODES = tuple(f"{d}/{lp}" for d in ("greedy", "sampled") for lp in LOGPROBS)
EMBEDDERS = ("minilm", "tiered", "static", "tiered-bf16")
KNOWN = (*EMBEDDERS, "minilm-bf16")
# Each compared with MiniLM everywhere (float32): the question of the module docstring.
COMPARED = ("tiered", "tiered-bf16", "minilm-bf16")
VARIANTS = eval_corpus.VARIANTS
TOLERANCE = 0.10
SIZES = {"default": 100, "small": 2}  # calibration draws, one stream each


def load(request: CorpusRequest, embedder: str) -> CorpusEval:
    """The corpus read, stripped to the request's mode and scored by one scorer
    (``tiered-bf16``: the tiered scorer with MiniLM in bfloat16, ``embedding.dtype``)."""
    tier, _, dtype = embedder.partition("-")
    settings = EmbeddingSettings(dtype={"bf16": "bfloat16"}.get(dtype, "float32"))
    return corpus_eval.load(settings, replace(request, embedder=tier))


def run_mode(ev: CorpusEval, request: CorpusRequest, decoding: str) -> dict[str, Any]:
    """One mode with one scorer, reduced to the decision: the route carries the
    evaluation prompts of one decoding, each at most once a stream."""
    t0 = time.perf_counter()
    rows = corpus_eval.run(ev, replace(request, only=("decoding", decoding)))
    healthy = rows[0]
    return {
        "false_rollbacks": healthy.false_rollbacks,
        "healthy_pairs": healthy.healthy_pairs,
        "streams": healthy.streams,
        "delay": {
            r.variant: {"median": r.delay_p50, "p90": r.delay_p90, "missed": r.missed}
            for r in rows[1:]
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
    corpus: Path,
    modes: Sequence[str],
    embedders: Sequence[str],
    draws: int,
    calibration: int,
    seed: int,
) -> dict[str, Any]:
    started = time.perf_counter()
    # The pool eval_corpus.py cuts (the same prompts apart), the calibration at most it.
    complete, pool = eval_corpus.pool_size(corpus)
    size = min(calibration, pool)
    base = CorpusRequest(
        pairs=corpus,
        healthy_label=eval_corpus.HEALTHY,
        variants=VARIANTS,
        calibration_prompts=size,
        calibration_pool=pool,
        draws=draws,
        seed=seed,
    )
    loaded: dict[tuple[str, str], CorpusEval] = {}
    out: dict[str, Any] = {}
    distinct = 0
    for mode in modes:
        decoding, logprobs = mode.split("/")
        request = replace(base, logprobs=logprobs)  # type: ignore[arg-type]
        per: dict[str, Any] = {}
        for e in embedders:
            if (logprobs, e) not in loaded:  # one scoring per scorer and log-prob mode
                loaded[(logprobs, e)] = load(request, e)
            ev = loaded[(logprobs, e)]
            distinct = len(ev.eval_pool)
            per[e] = run_mode(ev, request, decoding)
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
        "size": {
            "complete_prompts": complete,
            "calibration_pool": pool,
            "calibration_prompts": size,
            "distinct_eval_prompts": distinct,
            "draws": draws,
            "seed": seed,
        },
        "protocol": "bench/eval_corpus.py's (no replay, calibration drawn apart, "
        "int8 healthy and blessed, GPTQ int4 and int3 from a random onset)",
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
        f"`python bench/decisions.py --draws {size['draws']} --calibration "
        f"{size['calibration_prompts']}`: the traffic corpus's evaluation "
        "(`bench/eval_corpus.py`'s protocol) with each scorer: calibrations of "
        f"{size['calibration_prompts']} prompts drawn {size['draws']} times from a pool of "
        f"{size['calibration_pool']}, apart from the {size['distinct_eval_prompts']} "
        "evaluation prompts; per mode the route carries the evaluation prompts of that "
        "decoding, each at most once a stream, int8 until a random onset, then the broken "
        f"variant (seed {size['seed']}, the default policy). Delay in route pairs, median / "
        "p90 (a missed stream counts as the rest of its stream + 1); FR: false rollbacks "
        "over the healthy pairs shown. Machine: "
        f"{m['nproc']} cores, {m['cpu']}.",
        "",
        "| mode | scorer | FR (healthy pairs) | "
        + " | ".join(f"{v} delay | {v} missed" for v in VARIANTS)
        + " |",
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
                f"| {mode} | {name} | {r['false_rollbacks']} ({r['healthy_pairs']:,}) | "
                + " | ".join(cells)
                + " |"
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
    ap.add_argument("--corpus", type=Path, default=eval_corpus.ROOT / "corpus" / "pairs")
    ap.add_argument("--small", action="store_true", help="a smoke size: 2 calibration draws")
    ap.add_argument("--draws", type=int, default=None, help="calibration draws, a stream each")
    ap.add_argument(
        "--calibration",
        type=int,
        default=300,
        help="calibration prompts per draw (at most the pool the corpus can spare)",
    )
    ap.add_argument(
        "--seed", type=int, default=0, help="the cut and the draws (0: eval_corpus.py's cut)"
    )
    ap.add_argument("--modes", default=",".join(MODES), help="comma-separated decoding/logprobs")
    ap.add_argument("--embedders", default=",".join(EMBEDDERS))
    ap.add_argument("--json", action="store_true", help="end with one JSON object")
    ap.add_argument("--write", type=Path, default=None, help="write/update a section in this file")
    args = ap.parse_args(argv)
    draws = args.draws or SIZES["small" if args.small else "default"]
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    embedders = [e.strip() for e in args.embedders.split(",") if e.strip()]
    unknown = [m for m in modes if m not in MODES] + [e for e in embedders if e not in KNOWN]
    if unknown:
        ap.error(f"unknown mode or embedder: {', '.join(unknown)}")
    if not args.corpus.exists():
        sys.exit(f"{args.corpus} is missing (quantdrift lab corpus record writes it)")
    result = run(args.corpus, modes, embedders, draws, args.calibration, args.seed)
    size = result["size"]
    print(
        f"decisions: corpus {args.corpus}: {size['complete_prompts']} complete prompts, "
        f"{size['distinct_eval_prompts']} evaluation, calibration {size['calibration_prompts']} "
        f"of a pool of {size['calibration_pool']}, {draws} draws",
        file=sys.stderr,
        flush=True,
    )
    if args.write:
        write_section(args.write, _markdown(result), SECTION)
        print(f"wrote {args.write}")
    if args.json:
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
