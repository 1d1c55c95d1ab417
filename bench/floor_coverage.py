"""How often a calibration sets a divergence null below what healthy traffic then shows.

    python bench/floor_coverage.py [--corpus corpus/pairs] [--draws 200] [--seed 1] [--json]
                                   [--write BENCHMARKS.md]

A divergence test (lexical, dissimilarity, teacher-forced KL, entropy) rolls a route
back, given pairs enough, whenever the healthy candidate's mean x on the traffic sits
above its null: the blessed floor's upper bound plus δ. That happens exactly when the
calibration came out low against the traffic, so the rate of such calibrations is the
false-rollback rate a long healthy stream meets, before the e-detector's own share.

On the traffic corpus (``corpus/pairs``, cut into a calibration pool and evaluation
prompts as ``bench/eval_corpus.py`` cuts it) and per decoding mode, the healthy int8
pairs of the evaluation prompts stand for the traffic (their mean x is what a long
stream of them learns), and the null is drawn ``--draws`` times from the calibration
pool's blessed int8 pairs, through the same ``seed_from_pairs`` and null as
``quantdrift calibrate`` and the judge:

* ``bootstrap``: the eval's ``--calibration-draws`` (a bootstrap over the calibration
  prompts, as many as there are);
* ``half``: half of the calibration prompts, drawn without replacement (a smaller
  calibration of distinct prompts).

A row gives the traffic's mean x, the whole calibration's null, and per draw kind the
share of draws whose null sits below the traffic's mean (``miss``). Beside it, the
other side of the same null: per broken variant, its mean x on the evaluation prompts
and the pairs the test would need at the whole calibration's null,
``log(arl) / g`` with ``g`` the best growth per pair of the test's own bets
(``max_f E[log(1 + f / m (x - m))]`` over its bet fractions), Wald's approximation; a
variant whose mean sits at or under the null is never called (``-``).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import eval_corpus
import numpy as np
from common import policy_flag, write_section

from quantdrift.breaker.policy import load_policy
from quantdrift.breaker.rules import signal_arl
from quantdrift.breaker.rules.reading import read
from quantdrift.breaker.rules.tolerance import null_mean, observe
from quantdrift.config import EmbeddingSettings
from quantdrift.detectors.noise_floor import NoiseFloor, NoiseFloorState
from quantdrift.detectors.tolerance import DIVERGENCES, BettingSR
from quantdrift.evaluation import ScoreCache
from quantdrift.evaluation.cache import to_score
from quantdrift.evaluation.calibration import seed_from_pairs
from quantdrift.evaluation.corpus import prompt_of
from quantdrift.evaluation.modes import select, strip
from quantdrift.schemas import PairEvent
from quantdrift.services.evaluation import calibration_draws, calibration_prompts
from quantdrift.services.pairs import read_pairs
from quantdrift.services.scoring import build_embedder

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "corpus" / "pairs"
ROUTE = "eval/route"
# The broken variants by the column that shows them: the corpus's int4 is the GPTQ
# checkpoint on vLLM's kernel, its int3 group-wise.
BROKEN = {"int4": "int4-g64-gptq", "int3": "int3-g64"}
SECTION = "## How often a calibration comes out low"


def floor_state(
    calibration: list[PairEvent], cache: ScoreCache, decoding: str, policy: Any
) -> NoiseFloorState:
    """The floor ``quantdrift calibrate --blessed-label int8`` writes from these pairs."""
    blessed = select(calibration, labels=("int8",), kinds=("shadow",))
    seed, _ = seed_from_pairs([], blessed, cache, policy, ROUTE)
    return NoiseFloor().extend(NoiseFloorState(), seed.get(decoding, []))


def split(
    pairs: list[PairEvent], decoding: str
) -> tuple[list[PairEvent], list[PairEvent], dict[str, list[PairEvent]]]:
    """One decoding mode's calibration pairs (the calibration pool ``bench/eval_corpus.py``
    cuts), its healthy int8 traffic (shadow pairs of the evaluation prompts), and each
    broken variant's shadow pairs there."""
    cal, ev = eval_corpus.cut(pairs)
    mine = select(pairs, decoding=decoding)  # type: ignore[arg-type]
    evaluation = [p for p in select(mine, kinds=("shadow",)) if prompt_of(p) in ev]
    broken = {col: [p for p in evaluation if p.label == label] for col, label in BROKEN.items()}
    calibration = [p for p in mine if prompt_of(p) in cal]
    return calibration, select(evaluation, labels=("int8",)), broken


def half_draws(
    calibration: list[PairEvent], traffic: list[PairEvent], draws: int, seed: int
) -> list[list[PairEvent]]:
    """``draws`` seeded halves of the calibration's prompts (none a traffic prompt, as
    the eval's draws), without replacement."""
    by_prompt = calibration_prompts(calibration, traffic)
    prompts = list(by_prompt)
    out = []
    for d in range(draws):
        rng = np.random.default_rng([seed, d, 1])
        picked = rng.choice(len(prompts), size=len(prompts) // 2, replace=False)
        out.append([p for i in picked for p in by_prompt[prompts[int(i)]]])
    return out


def coverage(
    pairs: list[PairEvent],
    draws: int,
    seed: int,
    cache: ScoreCache,
    policy_file: Path | None = None,
) -> list[dict[str, Any]]:
    """One row per (decoding, signal) with a blessed floor: traffic mean, nulls, misses
    (the nulls of ``policy_file``'s default route policy; none: the default policy)."""
    policy = load_policy(policy_file)
    rp = policy.for_route(ROUTE)
    pairs = [strip(p, "full") for p in pairs]
    rows = []
    for decoding in ("greedy", "sampled"):
        calibration, traffic, broken = split(pairs, decoding)
        cache.fill([*calibration, *traffic, *(p for v in broken.values() for p in v)])
        scores = [to_score(p, cache[p], rp, ROUTE) for p in traffic]
        broken_scores = {
            label: [to_score(p, cache[p], rp, ROUTE) for p in v] for label, v in broken.items()
        }
        kinds = {
            "bootstrap": calibration_draws(calibration, traffic, draws, seed),
            "half": half_draws(calibration, traffic, draws, seed),
        }
        floors = {k: [floor_state(c, cache, decoding, rp) for c in v] for k, v in kinds.items()}
        whole = floor_state(calibration, cache, decoding, rp)
        for signal in DIVERGENCES:
            xs = [x for s in scores if (x := observe(rp, signal, read(rp, s, None))) is not None]
            if not xs:
                continue
            mean = float(np.mean(xs))
            null = null_mean(rp, signal, scores[0], whole)
            if null is None:
                continue
            row: dict[str, Any] = {
                "decoding": decoding,
                "signal": signal,
                "traffic_pairs": len(xs),
                "traffic_mean": round(mean, 4),
                "null_whole": round(null[0], 4),
            }
            arl = signal_arl(rp, signal) or float("inf")
            for label, bs in broken_scores.items():
                bx = [x for b in bs if (x := observe(rp, signal, read(rp, b, None))) is not None]
                row[f"{label}_mean"] = round(float(np.mean(bx)), 4) if bx else None
                row[f"{label}_pairs"] = wald_pairs(bx, null[0], arl)
            for kind, states in floors.items():
                nulls = [null_mean(rp, signal, scores[0], f) for f in states]
                used = [n[0] for n in nulls if n is not None]
                missed = sum(n < mean for n in used)
                row[f"{kind}_miss"] = round(missed / len(used), 3) if used else None
                row[f"{kind}_abstain"] = len(nulls) - len(used)
            rows.append(row)
    return rows


def wald_pairs(xs: list[float], null: float, arl: float) -> float | None:
    """Pairs a test at ``null`` needs on x drawn from ``xs``: ``log(arl) / g``, None if
    its best bet does not grow (the variant sits at or under the null)."""
    if not xs or null >= 1.0:
        return None
    weight = 1.0 / len(xs)
    g, _ = BettingSR(arl=arl).growth([(float(x), weight) for x in xs], null)
    return round(math.log(arl) / g, 1) if g > 0 else None


def markdown(result: dict[str, Any]) -> str:
    lines = [
        SECTION,
        "",
        f"`python bench/floor_coverage.py --draws {result['draws']} --seed {result['seed']}"
        f"{policy_flag(result.get('policy'))}`: "
        f"on the traffic corpus, cut as `bench/eval_corpus.py` cuts it "
        f"({result['calibration_prompts']} calibration prompts, "
        f"{result['distinct_eval_prompts']} evaluation prompts), "
        "per decoding mode and divergence test: the healthy int8 pairs of the "
        "evaluation prompts stand for traffic (*traffic mean* x, what a long healthy stream "
        "learns), and the test's null (blessed floor bound + δ) is drawn from the "
        "calibration prompts' int8 pairs: the whole calibration once, then "
        f"{result['draws']} bootstrap draws (as `--calibration-draws`) and "
        f"{result['draws']} halves without replacement. *miss*: the share of draws whose "
        "null sits below the traffic mean, each of which rolls a long healthy stream back. "
        "*int4*: the broken variant's mean x (the GPTQ checkpoint; *int3*: int3-g64) on the "
        "evaluation prompts and, after the arrow, "
        "the pairs the test alone needs at the whole calibration's null (Wald's "
        "approximation; `-`: never, its mean is under the null).",
        "",
        "| set | mode | test | traffic mean | null (whole) | miss, bootstrap | miss, half "
        "| int4 | int3 |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, rows in result["sets"].items():
        for r in rows:
            lines.append(
                f"| {name} | {r['decoding']} | {r['signal']} | {r['traffic_mean']:.3f} | "
                f"{r['null_whole']:.3f} | {_pct(r['bootstrap_miss'])} | {_pct(r['half_miss'])} "
                f"| {power_cell(r, 'int4')} | {power_cell(r, 'int3')} |"
            )
    return "\n".join(lines) + "\n"


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v:.1%}"


def power_cell(row: dict[str, Any], label: str) -> str:
    mean, pairs = row.get(f"{label}_mean"), row.get(f"{label}_pairs")
    if mean is None:
        return "-"
    return f"{mean:.3f} → {'-' if pairs is None else f'{pairs:g}'}"


def run_sets(
    argv: list[str] | None,
    *,
    bench: str,
    description: str,
    section: str,
    per_set: Callable[[list[PairEvent], int, int, ScoreCache, Path | None], list[dict[str, Any]]],
    markdown: Callable[[dict[str, Any]], str],
) -> int:
    """The command line of a bench that reads each recorded pair set with ``--draws``
    calibration draws (this one and ``signal_power.py``): rows per set, then the section
    printed or written and, with ``--json``, one JSON object."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--draws", type=int, default=200)
    ap.add_argument("--embedder", default=None, help="the worker's default when not given")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--corpus", type=Path, default=CORPUS, help="the recorded traffic corpus")
    ap.add_argument("--policy", type=Path, default=None, help="a policy file (default: none)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--write", type=Path, default=None)
    args = ap.parse_args(argv)
    embedder, _tier = build_embedder(EmbeddingSettings(), args.embedder)
    result: dict[str, Any] = {
        "draws": args.draws,
        "seed": args.seed,
        "policy": str(args.policy) if args.policy else None,
        "sets": {},
    }
    if not args.corpus.exists():
        sys.exit(f"{args.corpus} is missing (quantdrift lab corpus record writes it)")
    pairs = read_pairs(args.corpus)
    cal, ev = eval_corpus.cut(pairs)
    result["calibration_prompts"], result["distinct_eval_prompts"] = len(cal), len(ev)
    print(
        f"{bench}: corpus {args.corpus}: {len(cal)} calibration prompts, {len(ev)} evaluation",
        file=sys.stderr,
        flush=True,
    )
    cache = ScoreCache(embedder)
    result["sets"]["corpus"] = per_set(pairs, args.draws, args.seed, cache, args.policy)
    text = markdown(result)
    if args.write:
        write_section(args.write, text, section)
    if args.json:
        print(json.dumps({"bench": bench, **result}))
    else:
        print(text)
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_sets(
        argv,
        bench="floor_coverage",
        description=__doc__.splitlines()[0],
        section=SECTION,
        per_set=coverage,
        markdown=markdown,
    )


if __name__ == "__main__":
    raise SystemExit(main())
