"""Would another per-pair signal call a broken variant sooner than the tolerance tests do?

    python bench/signal_power.py [--corpus corpus/pairs] [--draws 200] [--seed 1] [--json]
                                 [--write BENCHMARKS.md]

The tolerance rule tests four divergences (lexical, dissimilarity, entropy, teacher-forced
KL) beside the paired outcomes and hard failures. A pair carries more: Jaccard, ROUGE-1,
BLEU, the length ratio, the top-k KL and the flip rate of the candidate's log-probs, and
the entropy shift's sign (``entropy_up``, ``entropy_down``: one-sided, where the test
takes its size). This bench asks, on the traffic corpus (``corpus/pairs``, its calibration
pool and evaluation prompts cut as ``bench/eval_corpus.py`` cuts them), whether any of
them would make a better test, under the same terms for every signal:

* each signal maps a pair to ``x`` in [0, 1] (larger: further from the reference), and
  its null is the blessed int8 calibration's bound (``mix_robust_upper``, the one the
  divergence tests use) plus a tolerance ``δ``;
* ``δ`` is the *oracle* tolerance: the smallest one for which at most 2.5 % of
  ``--draws`` bootstrap draws of the calibration prompts (the eval's
  ``--calibration-draws``) put the null below the healthy int8 traffic's mean x on the
  evaluation prompts. It is fitted on the evaluation prompts, so it is optimistic for
  every signal alike, the current four included: a signal that needs more pairs than the
  current ones even so cannot help;
* at that null, the pairs the test alone needs against each broken variant on the
  evaluation prompts: Wald's approximation ``log(arl) / g`` with the test's own bets
  (``floor_coverage.wald_pairs``), at one divergence's share of the budget.

Which signals a mode has: ``flip_rate``, ``kl`` and the entropy signals need the pairs'
log-probs, ``tf_kl`` teacher forcing; the text signals are in every mode.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from common import policy_flag
from floor_coverage import ROUTE, power_cell, run_sets, split, wald_pairs

from quantdrift.breaker.policy import RoutePolicy, load_policy
from quantdrift.breaker.rules import signal_arl
from quantdrift.detectors.tolerance import (
    CALIBRATION_ALPHA,
    clip_metric,
    divergence_x,
    mix_robust_upper,
)
from quantdrift.evaluation import ScoreCache
from quantdrift.evaluation.modes import select, strip
from quantdrift.schemas import PairEvent
from quantdrift.schemas.score import Metrics
from quantdrift.services.evaluation import calibration_draws

SECTION = "## Would another signal call int4 sooner?"
LOG4 = math.log(4.0)


def _length(m: Metrics) -> float | None:
    # |log| of the length ratio, 4x longer or shorter saturating: either way is a change.
    if m.length_ratio is None or m.length_ratio <= 0:
        return None
    return min(1.0, abs(math.log(m.length_ratio)) / LOG4)


# The tolerance rule's own divergences, in the table's order; their x is the rule's own
# (``divergence_x``, with the policy's clips).
CURRENT = ("lexical", "dissimilarity", "entropy", "tf_kl")


# The signals a pair carries that no tolerance test uses: x in [0, 1] from its metrics
# (the policy for the top-k KL's clip, the teacher-forced one's).
def _clipped(metric: str) -> Callable[[Metrics, RoutePolicy], float | None]:
    """x of ``metric`` by the tolerance tests' mapping (``clip_metric``: one minus a
    similarity, a divergence over the teacher-forced KL's clip); None when absent."""

    def x(m: Metrics, rp: RoutePolicy) -> float | None:
        value = getattr(m, metric)
        return None if value is None else clip_metric(metric, value, rp.tf_kl_clip)

    return x


def _signed_entropy(sign: float) -> Callable[[Metrics, RoutePolicy], float | None]:
    """x of the entropy shift in one direction: ½ at no shift, 1 at ``entropy_clip`` nats
    more (``sign`` 1) or less (-1). The tolerance test takes |shift|, which also counts
    sampling noise of either sign as divergence; a one-sided x averages that noise out,
    so it would be the sharper test if a broken variant moved entropy one way."""

    def x(m: Metrics, rp: RoutePolicy) -> float | None:
        if m.entropy_shift is None:
            return None
        return min(1.0, max(0.0, 0.5 + sign * m.entropy_shift / (2.0 * rp.entropy_clip)))

    return x


OTHERS: dict[str, Callable[[Metrics, RoutePolicy], float | None]] = {
    "jaccard": _clipped("jaccard"),
    "rouge1": _clipped("rouge1"),
    "bleu": _clipped("bleu"),
    "length": lambda m, rp: _length(m),
    "kl": _clipped("kl"),
    "flip_rate": lambda m, rp: m.flip_rate,
    "entropy_up": _signed_entropy(1.0),
    "entropy_down": _signed_entropy(-1.0),
}


def xs(pairs: list[PairEvent], cache: ScoreCache, signal: str, rp: RoutePolicy) -> list[float]:
    """The pairs' x for ``signal`` (pairs without it left out)."""
    if signal in CURRENT:
        found = (divergence_x(cache[p], signal, rp.tf_kl_clip, rp.entropy_clip) for p in pairs)
    else:
        found = (OTHERS[signal](cache[p], rp) for p in pairs)
    return [x for x in found if x is not None]


def oracle_delta(bounds: list[float], traffic_mean: float, alpha: float) -> float:
    """The smallest δ >= 0 for which at most ``alpha`` of the draws' nulls (bound + δ) sit
    below the traffic's mean."""
    gaps = sorted(traffic_mean - b for b in bounds)
    # With δ at the ceil((1 - alpha) * n)-th smallest gap, at most alpha * n gaps exceed it.
    k = min(len(gaps) - 1, max(0, math.ceil((1.0 - alpha) * len(gaps)) - 1))
    return max(0.0, gaps[k])


def power(
    pairs: list[PairEvent],
    draws: int,
    seed: int,
    cache: ScoreCache,
    policy_file: Path | None = None,
) -> list[dict[str, Any]]:
    """One row per (decoding, signal) that the int8 calibration and traffic both carry
    (bounds at ``policy_file``'s calibration mix ratio; none: the default policy's)."""
    rp = load_policy(policy_file).for_route(ROUTE)
    ratio = rp.calibration_mix_ratio
    arl = signal_arl(rp, "lexical") or 1e6
    pairs = [strip(p, "full") for p in pairs]
    rows = []
    for decoding in ("greedy", "sampled"):
        calibration, traffic, broken = split(pairs, decoding)
        blessed = select(calibration, labels=("int8",), kinds=("shadow",))
        cache.fill([*blessed, *traffic, *(p for v in broken.values() for p in v)])
        drawn = [
            select(d, labels=("int8",), kinds=("shadow",))
            for d in calibration_draws(calibration, traffic, draws, seed)
        ]
        for signal in (*CURRENT, *OTHERS):
            whole, healthy = xs(blessed, cache, signal, rp), xs(traffic, cache, signal, rp)
            if len(whole) < rp.min_floor_pairs or not healthy:
                continue
            mean = float(np.mean(healthy))
            per_draw = [xs(d, cache, signal, rp) for d in drawn]
            bounds = [mix_robust_upper(v, ratio) for v in per_draw if len(v) >= 2]
            delta = oracle_delta(bounds, mean, CALIBRATION_ALPHA)
            null = mix_robust_upper(whole, ratio) + delta
            row: dict[str, Any] = {
                "decoding": decoding,
                "signal": signal,
                "current": signal in CURRENT,
                "traffic_mean": round(mean, 4),
                "oracle_delta": round(delta, 4),
                "null": round(null, 4),
            }
            for label, v in broken.items():
                bx = xs(v, cache, signal, rp)
                row[f"{label}_mean"] = round(float(np.mean(bx)), 4) if bx else None
                row[f"{label}_pairs"] = wald_pairs(bx, null, arl) if bx else None
            rows.append(row)
    return rows


def markdown(result: dict[str, Any]) -> str:
    lines = [
        SECTION,
        "",
        f"`python bench/signal_power.py --draws {result['draws']} --seed {result['seed']}"
        f"{policy_flag(result.get('policy'))}`: "
        "every signal a pair carries, tested alike, on the traffic corpus cut as "
        f"`bench/eval_corpus.py` cuts it ({result['calibration_prompts']} calibration "
        f"prompts, {result['distinct_eval_prompts']} evaluation prompts). "
        "The null is the blessed int8 "
        "calibration's bound plus the *oracle* δ, the smallest tolerance for which at most "
        "2.5 % of the calibration's bootstrap draws would set the null below the healthy "
        "int8 traffic's mean (fitted on the evaluation prompts: optimistic for every "
        "signal). *int4* / *int3*: the variant's mean x and, after the arrow, the pairs the "
        "test alone needs at that null (Wald; `-`: never, its mean is under the null). "
        "Signals marked * are the tolerance rule's own.",
        "",
        "| set | mode | signal | traffic mean | oracle δ | null | int4 | int3 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, rows in result["sets"].items():
        for r in rows:
            star = "*" if r["current"] else ""
            lines.append(
                f"| {name} | {r['decoding']} | {r['signal']}{star} | {r['traffic_mean']:.3f} "
                f"| {r['oracle_delta']:.3f} | {r['null']:.3f} | {power_cell(r, 'int4')} "
                f"| {power_cell(r, 'int3')} |"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    return run_sets(
        argv,
        bench="signal_power",
        description=__doc__.splitlines()[0],
        section=SECTION,
        per_set=power,
        markdown=markdown,
    )


if __name__ == "__main__":
    raise SystemExit(main())
