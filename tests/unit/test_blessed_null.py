"""Each rule at its null's boundary, with a blessed baseline from a shifted prompt mix.

An operator blesses a candidate from 40 calibration pairs; traffic then brings the
same kinds of prompts in another mix. The null a rule promises is "no worse than the
blessed behaviour *on the traffic* by more than δ". Each stream here draws its own
calibration (40 blessed pairs from the calibration mix, through the calibration's
``floor_seed``), then ``LENGTH`` candidate pairs whose mean sits exactly at that
null's boundary, and asks whether the route's tolerance rule ever crossed.

What a stream may cost: the e-detector's share, at most ``LENGTH / arl`` (an
e-detector with threshold A stopped at L pairs alarms with probability <= L / A),
plus the chance that the calibration itself set the null below the truth
(``CAL_MISS``: the blessed bound's stated level). The false-rollback rate over the
streams must stay within that, by an exact (Clopper-Pearson) upper bound.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from scipy.stats import beta as beta_dist

from quantdrift.breaker.policy import RoutePolicy
from quantdrift.breaker.rules import signal_arl
from quantdrift.breaker.rules.reading import read
from quantdrift.breaker.rules.tolerance import null_mean, step
from quantdrift.detectors.noise_floor import NoiseFloor, NoiseFloorState
from quantdrift.detectors.tolerance import CALIBRATION_ALPHA, CALIBRATION_MIX_RATIO
from quantdrift.evaluation.calibration import floor_seed
from quantdrift.schemas import Metrics, ScoreEvent

STREAMS = 60
LENGTH = 2000
CALIBRATION_PAIRS = 40
BUDGET_PAIRS = 100_000  # small, so a wrong null shows within a stream
# Two task families; traffic is half of each, calibration is shifted towards "prose".
TRAFFIC_MIX = 0.5
CALIBRATION_MIX = 0.4  # share of "json" prompts

# Outcomes: P(only the blessed candidate fails), P(only the reference fails), per family.
BLESSED_FAILS = {"json": 0.12, "prose": 0.02}
REFERENCE_FAILS = {"json": 0.02, "prose": 0.01}
# Hard failures (a loop the reference does not show) of the blessed candidate, per family.
BLESSED_LOOPS = {"json": 0.06, "prose": 0.01}
# Dissimilarity (1 - cosine) of the blessed candidate, per family: Beta(a, b).
BLESSED_DIVERGENCE = {"json": (2.0, 10.0), "prose": (2.0, 18.0)}

Draw = Callable[[np.random.Generator, int, float], list[Metrics]]


def families(rng: np.random.Generator, n: int, mix: float) -> np.ndarray:
    return rng.random(n) < mix  # True: json


def outcome_pairs(extra: float) -> Draw:
    """Pairs whose candidate fails alone ``extra`` more often than the blessed one."""

    def draw(rng: np.random.Generator, n: int, mix: float) -> list[Metrics]:
        out = []
        for is_json in families(rng, n, mix):
            family = "json" if is_json else "prose"
            u = rng.random()
            only_cand = u < BLESSED_FAILS[family] + extra
            only_ref = not only_cand and u > 1.0 - REFERENCE_FAILS[family]
            out.append(
                Metrics(
                    json_ok=not only_cand,
                    reference_json_ok=not only_ref,
                    candidate_tokens=20,
                )
            )
        return out

    return draw


def outcomes_boundary_extra(policy: RoutePolicy) -> float:
    """Extra candidate-only failures putting the traffic mean at blessed + δ / 2.

    Mean x = 1/2 + (p_cand_only - p_ref_only) / 2, so δ more candidate-only
    failures than the blessed candidate's, where the reference fails alike.
    """
    return policy.tolerance_outcomes


def hard_pairs(extra: float) -> Draw:
    """Pairs whose candidate loops ``extra`` more often than the blessed one (the
    reference never does), so the traffic's rate is the blessed one's plus ``extra``."""

    def draw(rng: np.random.Generator, n: int, mix: float) -> list[Metrics]:
        out = []
        for is_json in families(rng, n, mix):
            loops = rng.random() < BLESSED_LOOPS["json" if is_json else "prose"] + extra
            out.append(
                Metrics(repetition_run=12 if loops else 1, looping=bool(loops), candidate_tokens=20)
            )
        return out

    return draw


def divergence_pairs(extra: float, similarity: str = "cosine") -> Draw:
    """Pairs whose 1 - ``similarity`` (cosine, or rougeL for the lexical test) is the
    blessed candidate's, plus ``extra`` on average."""

    def draw(rng: np.random.Generator, n: int, mix: float) -> list[Metrics]:
        out = []
        for is_json in families(rng, n, mix):
            a, b = BLESSED_DIVERGENCE["json" if is_json else "prose"]
            d = min(1.0, float(rng.beta(a, b)) + extra)
            out.append(Metrics(**{similarity: 1.0 - d}, candidate_tokens=20))
        return out

    return draw


def score(i: int, m: Metrics) -> ScoreEvent:
    return ScoreEvent(
        pair_id=f"p{i}", route="r", kind="shadow", ts=float(i), decoding="sampled", metrics=m
    )  # type: ignore[arg-type]


def calibrated_floor(blessed: list[Metrics]) -> NoiseFloorState:
    """The floor ``quantdrift calibrate --blessed-label`` writes from these pairs."""
    seed, _ = floor_seed([], blessed=[score(i, m) for i, m in enumerate(blessed)])
    return NoiseFloor().extend(NoiseFloorState(), seed["sampled"])


def streams_with_a_false_rollback(
    policy: RoutePolicy, blessed: Draw, candidate: Draw, seed: int, streams: int = STREAMS
) -> int:
    hits = 0
    for k in range(streams):
        rng = np.random.default_rng([seed, k])
        floor = calibrated_floor(blessed(rng, CALIBRATION_PAIRS, CALIBRATION_MIX))
        tests: dict[str, tuple[float, ...]] = {}
        for i, m in enumerate(candidate(rng, LENGTH, TRAFFIC_MIX)):
            tests, crossed = step(policy, tests, read(policy, score(i, m), floor))
            if crossed:
                hits += 1
                break
    return hits


def clopper_pearson_upper(k: int, n: int, level: float = 0.95) -> float:
    return 1.0 if k >= n else float(beta_dist.ppf(level, k + 1, n - k))


def only(signal: str) -> RoutePolicy:
    """The default tolerances with the whole (small) budget on one signal (no slices)."""
    return RoutePolicy(
        false_alarm_budget_pairs=BUDGET_PAIRS, budget_split={signal: 1.0}, slice_dimensions=()
    )


@pytest.mark.long
@pytest.mark.parametrize(
    "signal, blessed, candidate, cal_miss, streams",
    [
        # Outcomes: the blessed bound is two exact one-sided bounds at CALIBRATION_ALPHA.
        (
            "outcomes",
            outcome_pairs(0.0),
            outcome_pairs(outcomes_boundary_extra(only("outcomes"))),
            2 * CALIBRATION_ALPHA,
            STREAMS,
        ),
        # Hard failures: the blessed rate's exact upper bound at CALIBRATION_ALPHA, + δ.
        # A loop is also a failed outcome; the budget here is the hard test's alone.
        # Without the blessing (the paired null, 2 %) every stream, at 5.5 %, rolls back.
        # 100 streams for the reason given under dissimilarity: a 4.5 % budget.
        (
            "hard",
            hard_pairs(0.0),
            hard_pairs(only("hard").tolerance_hard),
            CALIBRATION_ALPHA,
            100,
        ),
        # Dissimilarity: the blessed floor's mean bounded over traffic mixes within
        # CALIBRATION_MIX_RATIO (1.5; this case's is 1.25) and a t bound at CALIBRATION_ALPHA.
        # Its budget (4.5 %) needs more streams than outcomes' (7 %) to be reachable at
        # all: 0 of 100 bounds the rate at 3.0 %, 0 of 60 only at 4.9 %. Over seeds 20-27
        # one stream of 800 rolls back (seed 25): see docs/deciding.md.
        (
            "dissimilarity",
            divergence_pairs(0.0),
            divergence_pairs(only("dissimilarity").tolerance_dissimilarity),
            CALIBRATION_ALPHA,
            100,
        ),
        # Lexical: the same floor bound on 1 - ROUGE-L, the same budget.
        (
            "lexical",
            divergence_pairs(0.0, "rougeL"),
            divergence_pairs(only("lexical").tolerance_lexical, "rougeL"),
            CALIBRATION_ALPHA,
            100,
        ),
    ],
)
def test_false_rollbacks_at_the_null_boundary_stay_within_budget(
    signal: str, blessed: Draw, candidate: Draw, cal_miss: float, streams: int
) -> None:
    policy = only(signal)
    arl = signal_arl(policy, signal)
    assert arl == BUDGET_PAIRS
    hits = streams_with_a_false_rollback(policy, blessed, candidate, seed=20, streams=streams)
    budget = LENGTH / arl + cal_miss
    upper = clopper_pearson_upper(hits, streams)
    assert upper <= budget, (signal, hits, round(upper, 4), round(budget, 4))


def test_the_shifted_mix_is_one_the_divergence_floor_covers() -> None:
    # The floor promises its bound on traffic whose mix has a density within
    # [1 / CALIBRATION_MIX_RATIO, CALIBRATION_MIX_RATIO] of the calibration's: this
    # case's shift must be one of those, or passing it would prove nothing.
    ratios = [TRAFFIC_MIX / CALIBRATION_MIX, (1 - TRAFFIC_MIX) / (1 - CALIBRATION_MIX)]
    assert all(1 / CALIBRATION_MIX_RATIO <= r <= CALIBRATION_MIX_RATIO for r in ratios)


# --- the outcomes null, with and without a blessing --------------------------------------


def test_outcomes_null_without_a_blessing_or_on_an_old_floor_is_the_paired_one() -> None:
    policy = RoutePolicy()
    pair = score(0, Metrics(json_ok=True, reference_json_ok=True))
    paired = ((1 + policy.tolerance_outcomes) / 2, "paired")
    assert null_mean(policy, "outcomes", pair, None) == paired
    old = NoiseFloorState.from_json({"blessed:cosine": [0.9, 0.95] * 20})  # before outcomes
    assert null_mean(policy, "outcomes", pair, old) == paired
    few = NoiseFloorState({"blessed:outcomes": (1.0,) * (policy.min_floor_pairs - 1)})
    assert null_mean(policy, "outcomes", pair, few) == paired


def test_outcomes_null_with_a_blessing_is_the_blessed_rate_plus_delta() -> None:
    policy = RoutePolicy()
    pair = score(0, Metrics(json_ok=True, reference_json_ok=True))
    # 4 of 40 blessed pairs failed where the reference did not: bound 0.5 + U(4/40) / 2.
    worse = calibrated_floor([Metrics(json_ok=i >= 4, reference_json_ok=True) for i in range(40)])
    found = null_mean(policy, "outcomes", pair, worse)
    assert found is not None and found[1] == "blessed"
    upper = clopper_pearson_upper(4, 40, 1 - CALIBRATION_ALPHA)
    assert found[0] == pytest.approx(0.5 + upper / 2 + policy.tolerance_outcomes / 2, abs=1e-5)
    # A blessed candidate better than the reference never narrows the paired null.
    better = calibrated_floor([Metrics(json_ok=True, reference_json_ok=i >= 20) for i in range(40)])
    assert null_mean(policy, "outcomes", pair, better) == (
        (1 + policy.tolerance_outcomes) / 2,
        "paired",
    )
