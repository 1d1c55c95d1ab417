"""The tolerance rule: every anytime-valid test of a route, on one false-rollback budget.

Pure: :class:`Tolerance` is the rule the judge runs for each shadow pair of a
closed route. Per signal (see :mod:`quantdrift.detectors.tolerance`) it folds the
pair into a :class:`~quantdrift.detectors.tolerance.BettingSR` e-detector whose
run-length budget is the route's ``false_alarm_budget_pairs`` divided by the
signal's share in ``budget_split``: the false-alarm rates of all signals add up to
at most one per budget. A signal without evidence on this pair (no teacher-forced
log-probs, no entropy, no trusted floor) abstains: its state does not move.

Tests run from the first pair; ``min_pairs`` only holds the alarm back. A test
that crosses its threshold before ``min_pairs`` is remembered (``early``) and
trips the route at ``min_pairs``, even if later pairs pulled it back down.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from quantdrift.breaker.policy import RoutePolicy
from quantdrift.breaker.rules.reading import Fired, Pair
from quantdrift.detectors.noise_floor import NoiseFloorState
from quantdrift.detectors.tolerance import (
    DIVERGENCES,
    SIGNALS,
    BettingSR,
    BettingState,
    blessed_hard_rate,
    blessed_outcome_mean,
    divergence_x,
    floor_mean,
    floor_metric,
    outcome_x,
)
from quantdrift.schemas.score import ScoreEvent


@dataclass(frozen=True, slots=True)
class Crossing:
    """A signal whose test crossed its threshold, with what explains it."""

    signal: str
    reason: str
    evidence: dict[str, Any]


def active_signals(policy: RoutePolicy) -> tuple[str, ...]:
    """The anytime-valid tests the policy's rules run: the tolerance signals, and the
    rank e-CUSUM when the policy lists ``sequential``."""
    active = SIGNALS if "tolerance" in policy.rules else ()
    return (*active, "sequential") if "sequential" in policy.rules else active


def _weight(policy: RoutePolicy, signal: str, active: tuple[str, ...]) -> float:
    """``signal``'s ``budget_split`` weight over the sum of the ``active`` tests' weights."""
    weights = {str(k): v for k, v in policy.budget_split.items()}
    total = sum(weights.get(s, 0.0) for s in active)
    return weights.get(signal, 0.0) / total if signal in active and total > 0 else 0.0


def signal_arl(policy: RoutePolicy, signal: str) -> float | None:
    """The aggregate test's share of the route's budget as a mean run length (None: no
    share).

    Shares are ``budget_split`` weights normalised over the tests the policy runs,
    times the aggregate's share (``RoutePolicy.aggregate_share``: half of the budget
    when the policy judges slices, the slice tests having the other half), so the
    false-alarm rates of every test add up to at most one per budget, whichever rules
    a policy file lists.

    >>> p = RoutePolicy()
    >>> signal_arl(p, "hard"), signal_arl(p, "sequential")
    (8000000.0, None)
    >>> signal_arl(RoutePolicy(slice_dimensions=()), "hard")
    4000000.0
    >>> signal_arl(RoutePolicy(rules=("consecutive", "sequential")), "sequential")
    2000000.0
    """
    share = _weight(policy, signal, active_signals(policy)) * policy.aggregate_share
    return policy.false_alarm_budget_pairs / share if share > 0 else None


# The signals a slice is judged on: those whose null holds within any slice without a
# floor of its own. Paired outcomes cancel the slice's base rate (candidate against the
# reference on the same prompt); the hard-failure rate is tolerated per pair. A
# divergence's floor is the route's mix; a slice's healthy divergence may sit above it
# (a slice is the largest mix shift there is), so divergences wait for per-slice floors.
SLICE_SIGNALS = ("hard", "outcomes")


def slice_signals(policy: RoutePolicy) -> tuple[str, ...]:
    """The signals a slice value's tests run under ``policy`` (none without slices)."""
    if not policy.slice_dimensions or "tolerance" not in policy.rules:
        return ()
    return tuple(s for s in SLICE_SIGNALS if _weight(policy, s, SLICE_SIGNALS) > 0)


def slice_arl(policy: RoutePolicy, signal: str) -> float | None:
    """A slice value's test of ``signal`` as a mean run length (None: not run in slices).

    Every value of a dimension gets the dimension's whole share: the values split the
    dimension's pairs, so their false alarms add up to one share's worth (see
    docs/deciding.md, "Slices").

    >>> slice_arl(RoutePolicy(), "hard"), slice_arl(RoutePolicy(), "tf_kl")
    (10000000.0, None)
    """
    signals = slice_signals(policy)
    share = _weight(policy, signal, signals) * policy.dimension_share
    return policy.false_alarm_budget_pairs / share if share > 0 else None


def aggregate_arls(policy: RoutePolicy) -> dict[str, float]:
    """Per tolerance signal the aggregate runs, its run length."""
    arls = {s: signal_arl(policy, s) for s in SIGNALS}
    return {s: a for s, a in arls.items() if a is not None}


def null_mean(
    policy: RoutePolicy, signal: str, score: ScoreEvent, floor: NoiseFloorState | None
) -> tuple[float, str] | None:
    """The mean x may have under the null "no worse than δ", and where it comes from.

    Outcomes: no worse than the reference by more than δ (``paired``), or, where the
    floor holds a blessed baseline, no worse than the blessed candidate by more than
    δ (``blessed``): the blessed mean's exact upper bound plus δ / 2, never below the
    paired null (a blessing widens what is accepted, it never rolls back a candidate
    the reference-based rule would keep). Hard failures: at most ``tolerance_hard``,
    or the blessed rate's exact upper bound plus it. A floor without
    ``blessed:outcomes`` or ``blessed:hard`` (one written before they existed) gives
    the paired null.
    """
    if signal == "outcomes":
        paired = paired_null(policy, signal)
        blessed = (
            None if floor is None else blessed_outcome_mean(floor.values, policy.min_floor_pairs)
        )
        if blessed is None or blessed + policy.tolerance_outcomes / 2.0 <= paired:
            return paired, "paired"
        return min(1.0, blessed + policy.tolerance_outcomes / 2.0), "blessed"
    if signal == "hard":
        rate = None if floor is None else blessed_hard_rate(floor.values, policy.min_floor_pairs)
        if rate is None:
            return paired_null(policy, signal), "paired"
        return min(1.0, rate + policy.tolerance_hard), "blessed"
    if floor is None:
        return None
    metric = floor_metric(score.metrics, signal)
    clip, delta = _scale(policy, signal)
    found = floor_mean(
        floor.values, metric, clip, policy.min_floor_pairs, policy.calibration_mix_ratio
    )
    if found is None:
        return None
    mean, source = found
    return min(1.0, mean + delta / clip), source


def paired_null(policy: RoutePolicy, signal: str) -> float:
    """The null mean of ``hard`` or ``outcomes`` without a blessing: the tolerated rate of
    hard failures, and ``(1 + δ) / 2`` for paired outcomes (what the shadow cost estimate
    tests a drift against, as the judge does before any blessing).

    >>> paired_null(RoutePolicy(), "hard"), paired_null(RoutePolicy(), "outcomes")
    (0.02, 0.525)
    """
    if signal == "hard":
        return policy.tolerance_hard
    if signal == "outcomes":
        return (1.0 + policy.tolerance_outcomes) / 2.0
    raise ValueError(f"no paired null for {signal!r}: only hard and outcomes have one")


def _scale(policy: RoutePolicy, signal: str) -> tuple[float, float]:
    """(clip, δ) of a divergence in its own units (nats, or similarity points)."""
    if signal == "tf_kl":
        return policy.tf_kl_clip, policy.tolerance_tf_kl
    if signal == "entropy":
        return policy.entropy_clip, policy.tolerance_entropy
    if signal == "lexical":
        return 1.0, policy.tolerance_lexical
    return 1.0, policy.tolerance_dissimilarity


def observe(policy: RoutePolicy, signal: str, pair: Pair) -> float | None:
    """The pair's x in [0, 1] for ``signal``, None when the pair carries no evidence.

    The hard failure is the judge's reading of the pair (``reading.read``), where the
    policy's thresholds are applied once.
    """
    m = pair.score.metrics
    if signal == "outcomes":
        return outcome_x(m)
    if signal == "hard":
        return 1.0 if pair.hard else 0.0
    if signal == "tf_kl" and not policy.teacher_forced:
        return None
    return divergence_x(m, signal, policy.tf_kl_clip, policy.entropy_clip)


def step(
    policy: RoutePolicy,
    tests: Mapping[str, tuple[float, ...]],
    pair: Pair,
    arls: Mapping[str, float] | None = None,
) -> tuple[dict[str, tuple[float, ...]], list[Crossing]]:
    """Fold one shadow pair into every signal's test; the signals that crossed, in order.

    ``arls``: the run length of each signal to test (default: the aggregate's,
    :func:`aggregate_arls`; a slice passes its own).
    """
    score, floor = pair.score, pair.floor
    out = {k: tuple(v) for k, v in tests.items()}
    fired: list[Crossing] = []
    arls = aggregate_arls(policy) if arls is None else arls
    for signal in SIGNALS:
        arl = arls.get(signal)
        if arl is None:
            continue
        x = observe(policy, signal, pair)
        if x is None:
            continue
        null = null_mean(policy, signal, score, floor)
        if null is None:
            continue
        mean0, source = null
        test = BettingSR(arl=arl)
        state, signal_out = test.update(BettingState.from_json(out.get(signal)), x, mean0)
        out[signal] = tuple(state.to_json())
        if signal_out.drift_detected:
            observed = state.mean if state.mean is not None else x
            what = "divergence" if signal in DIVERGENCES else "rate"
            fired.append(
                Crossing(
                    signal,
                    f"{signal}: mean {what} {observed:.3f} over {state.n} pairs exceeds the "
                    f"tolerated {mean0:.3f} (log e {signal_out.statistic:.1f} >= "
                    f"log {arl:.3g})",
                    {
                        "signal": signal,
                        "pairs": state.n,
                        "mean_x": round(observed, 4),
                        "null_mean": round(mean0, 4),
                        "null_from": source,
                        "log_e": round(signal_out.statistic, 3),
                        "threshold": round(signal_out.threshold, 3),
                        "arl_pairs": arl,
                    },
                )
            )
    return out, fired


def summary(tests: Mapping[str, tuple[float, ...]]) -> dict[str, dict[str, float]]:
    """Per signal: pairs, mean x and the log e-statistic, for alerts and the status page."""
    rows = {}
    for signal, raw in tests.items():
        state = BettingState.from_json(raw)
        if state.n and state.log_r:
            rows[signal] = {
                "pairs": state.n,
                "mean_x": round(state.total / state.n, 4),
                "log_r_max": round(max(state.log_r), 3),
            }
    return rows


@dataclass(frozen=True, slots=True)
class ToleranceState:
    """Per signal, its e-detector's state (pairs, sum of x, log R per bet size);
    ``early`` names a signal whose test crossed before ``min_pairs``: that evidence
    is kept and trips at ``min_pairs``."""

    tests: dict[str, tuple[float, ...]] = field(default_factory=dict)
    early: str = ""


@dataclass(frozen=True, slots=True)
class Tolerance:
    """Every signal's test on the route's one budget; alarms on the first signal that
    crossed on this pair, else on the one kept in ``early``."""

    policy: RoutePolicy

    def init(self) -> ToleranceState:
        return ToleranceState()

    def update(self, state: ToleranceState, pair: Pair) -> tuple[ToleranceState, Fired | None]:
        tests, crossed = step(self.policy, state.tests, pair)
        early = state.early or (crossed[0].signal if crossed else "")
        new = ToleranceState(tests, early)
        if crossed:
            first = crossed[0]
            evidence = {**first.evidence, "tests": summary(tests)}
            return new, Fired(f"tolerance:{first.signal}", first.reason, evidence)
        if early:
            evidence = {"signal": early, "early": True, "tests": summary(tests)}
            return new, Fired(
                f"tolerance:{early}", f"{early}: crossed before min_pairs, kept", evidence
            )
        return new, None
