"""The tolerance rule under its null, on long seeded streams: the budget holds.

Each test draws pairs whose mean sits *exactly at* the null's boundary (the
hardest healthy candidate: worse than the reference by exactly δ) and counts
alarms, restarting after each: an e-detector with threshold A promises a mean
run length >= A, so over T pairs at most about T / A alarms.
"""

from __future__ import annotations

import numpy as np
import pytest

from quantdrift.breaker import RouteState, judge
from quantdrift.breaker.machine import initial_state
from quantdrift.breaker.policy import RoutePolicy
from quantdrift.breaker.rules import signal_arl
from quantdrift.breaker.rules.tolerance import ToleranceState, slice_arl
from quantdrift.detectors.noise_floor import NoiseFloor, NoiseFloorState
from quantdrift.detectors.tolerance import SIGNALS, BettingSR, BettingState, floor_mean
from quantdrift.schemas import Metrics, ScoreEvent


def alarms_under(test: BettingSR, xs: np.ndarray, null_mean: float) -> list[int]:
    state, out = test.init(), []
    for i, x in enumerate(xs):
        state, signal = test.update(state, float(x), null_mean)
        if signal.drift_detected:
            out.append(i)
            state = test.init()
    return out


@pytest.mark.parametrize(
    "name, draw, null_mean",
    [
        # A hard-failure rate exactly at the tolerated 5 %.
        ("bernoulli", lambda rng, n: (rng.random(n) < 0.05).astype(float), 0.05),
        # Paired outcomes: candidate-only failures 8 %, reference-only 3 %: E[d] = δ = 0.05.
        (
            "outcomes",
            lambda rng, n: (1 + (rng.random(n) < 0.08) - (rng.random(n) < 0.03)) / 2,
            0.525,
        ),
        # A bounded divergence with mean exactly at floor + δ (Beta, mean 0.3).
        ("beta", lambda rng, n: rng.beta(3.0, 7.0, n), 0.3),
    ],
)
def test_betting_sr_false_alarm_rate_stays_within_its_run_length(name, draw, null_mean) -> None:  # type: ignore[no-untyped-def]
    arl = 1000.0
    rng = np.random.default_rng(11)
    total = 60_000
    alarms = alarms_under(BettingSR(arl=arl), draw(rng, total), null_mean)
    assert len(alarms) <= total / arl, (name, len(alarms))


def test_betting_sr_healthy_within_tolerance_never_alarms_and_drift_is_fast() -> None:
    rng = np.random.default_rng(3)
    test = BettingSR(arl=1e6)
    healthy = rng.beta(1.0, 30.0, 50_000)  # mean 0.032, tolerated 0.08
    assert alarms_under(test, healthy, 0.08) == []
    drifted = np.concatenate([rng.beta(1.0, 30.0, 2000), rng.beta(3.0, 7.0, 200)])
    first = alarms_under(test, drifted, 0.08)[0]
    assert 2000 <= first <= 2000 + 20


def test_hard_failures_trip_within_five_pairs() -> None:
    # int2-like: every pair a hard failure, tolerated rate 5 %, the default budget.
    policy = RoutePolicy()
    test = BettingSR(arl=signal_arl(policy, "hard") or 0.0)
    assert alarms_under(test, np.ones(10), policy.tolerance_hard)[0] <= 4


# --- the whole rule, through judge(): every signal at once, one budget -------------------


def shadow(i: int, m: Metrics, decoding: str = "greedy") -> ScoreEvent:
    return ScoreEvent(
        pair_id=f"p{i}", route="r", kind="shadow", ts=float(i), decoding=decoding, metrics=m
    )  # type: ignore[arg-type]


def blessed_floor(rng: np.random.Generator, n: int = 40) -> NoiseFloorState:
    nf, state = NoiseFloor(), NoiseFloor().init()
    for _ in range(n):
        state = nf.update(
            state,
            {
                "blessed:tf_kl": float(rng.uniform(0.0, 0.02)),
                "blessed:cosine": float(rng.uniform(0.85, 0.99)),
                "blessed:abs_entropy_shift": float(rng.uniform(0.0, 0.2)),
            },
        )
    return state


def healthy_metrics(rng: np.random.Generator) -> Metrics:
    """Like the blessed baseline, with a few task failures on both sides."""
    return Metrics(
        tf_kl=float(rng.uniform(0.0, 0.02)),
        cosine=float(rng.uniform(0.85, 0.99)),
        entropy_shift=float(rng.uniform(-0.2, 0.2)),
        entropy_mean=1.0,
        json_ok=bool(rng.random() > 0.04),
        reference_json_ok=bool(rng.random() > 0.04),
        looping=bool(rng.random() < 0.02),
        reference_looping=bool(rng.random() < 0.02),
        repetition_run=int(rng.random() < 0.02) * 6,
        candidate_tokens=40,
    )


def run_judge(policy: RoutePolicy, floor: NoiseFloorState, metrics: list[Metrics]) -> list[int]:
    state, trips = initial_state(policy), []
    for i, m in enumerate(metrics):
        d = judge(policy, state, shadow(i, m), float(i), floor, NoiseFloor())
        state = d.state
        if d.transition is not None and d.transition.to_state == "open":
            trips.append(i)
            state = initial_state(policy)
    return trips


@pytest.mark.long
def test_default_policy_never_rolls_back_a_healthy_route_over_long_streams() -> None:
    rng = np.random.default_rng(5)
    floor = blessed_floor(rng)
    policy = RoutePolicy()
    assert run_judge(policy, floor, [healthy_metrics(rng) for _ in range(8000)]) == []


def test_default_policy_catches_a_broken_candidate_fast() -> None:
    rng = np.random.default_rng(6)
    floor = blessed_floor(rng)
    broken = [
        healthy_metrics(rng).model_copy(update={"tf_kl": float(rng.uniform(0.2, 0.5))})
        for _ in range(60)
    ]
    healthy = [healthy_metrics(rng) for _ in range(100)]
    trips = run_judge(RoutePolicy(), floor, healthy + broken)
    assert trips and 100 < trips[0] <= 120


@pytest.mark.long
def test_the_split_budget_holds_for_all_signals_at_their_boundary() -> None:
    # Every signal's mean exactly at its null at once, a small budget (one false alarm
    # per 1,000 pairs for the route, split 5 ways): over 12,000 pairs at most ~12 trips.
    rng = np.random.default_rng(8)
    policy = RoutePolicy(false_alarm_budget_pairs=1000, min_pairs=1)
    floor = NoiseFloorState({"blessed:tf_kl": (0.0, 0.002) * 20})
    base = floor_mean(floor.values, "tf_kl", policy.tf_kl_clip, 10, policy.calibration_mix_ratio)
    assert base is not None
    tf_null = base[0] + policy.tolerance_tf_kl / policy.tf_kl_clip
    total = 12_000

    def boundary(i: int) -> Metrics:
        return Metrics(
            # A divergence of 0 or tf_kl_clip nats whose scaled mean is exactly tf_null.
            tf_kl=policy.tf_kl_clip * float(rng.random() < tf_null),
            repetition_run=6 * int(rng.random() < policy.tolerance_hard),
            candidate_tokens=40,
        )

    trips = run_judge(policy, floor, [boundary(i) for i in range(total)])
    assert len(trips) <= total / policy.false_alarm_budget_pairs, len(trips)


def test_early_evidence_is_kept_until_min_pairs() -> None:
    # Ten hard failures cross the threshold before min_pairs (50); forty clean pairs
    # follow. The crossing is remembered and trips at pair 50, not discarded.
    policy = RoutePolicy(min_pairs=50)
    bad = Metrics(repetition_run=8, candidate_tokens=40)
    good = Metrics(candidate_tokens=40)
    state = initial_state(policy)
    events = []
    for i, m in enumerate([bad] * 10 + [good] * 60):
        d = judge(policy, state, shadow(i, m), float(i))
        state = d.state
        if d.transition is not None:
            events.append((i + 1, d.transition.rule))
    assert events == [(50, "tolerance:hard")]


def test_signals_without_a_trusted_floor_abstain() -> None:
    # Greedy noise floor that never varies: the divergences abstain, nothing moves.
    policy = RoutePolicy()
    floor = NoiseFloorState({"tf_kl": (0.0,) * 50, "cosine": (1.0,) * 50})
    state = initial_state(policy)
    for i in range(30):
        state = judge(policy, state, shadow(i, Metrics(tf_kl=0.9, cosine=0.1)), i, floor).state
    assert set(state.rules.tolerance.tests) == {"hard", "outcomes"}


def test_route_state_with_tests_survives_json_and_old_states_load() -> None:
    policy = RoutePolicy()
    state = judge(policy, RouteState(), shadow(1, Metrics(repetition_run=9)), 1.0).state
    assert state.rules.tolerance.tests and RouteState.from_json(state.to_json()) == state
    old = {"state": "closed", "epoch": 3, "pairs_seen": 2}
    assert RouteState.from_json(old).rules.tolerance == ToleranceState()


def test_betting_state_round_trips() -> None:
    test = BettingSR(arl=100.0)
    state, _ = test.update(test.init(), 0.7, 0.2)
    assert BettingState.from_json(state.to_json()) == state


def test_budget_split_is_normalised_over_the_tests_a_policy_runs() -> None:
    with pytest.raises(ValueError, match=">= 0"):
        RoutePolicy(budget_split={"hard": -0.1})
    with pytest.raises(ValueError, match="needs a weight"):
        RoutePolicy(rules=("sequential",), budget_split={"hard": 1.0})
    for policy in (
        RoutePolicy(),
        RoutePolicy(rules=("tolerance", "sequential", "window")),
        RoutePolicy(slice_dimensions=()),
        RoutePolicy(slice_dimensions=("task",), slice_share=0.3),
    ):
        rates = [1 / a for s in (*SIGNALS, "sequential") if (a := signal_arl(policy, s))]
        # Each dimension's values split its pairs: one dimension costs one value's rates.
        per_dimension = [1 / a for s in SIGNALS if (a := slice_arl(policy, s))]
        total = sum(rates) + len(policy.slice_dimensions) * sum(per_dimension)
        assert total == pytest.approx(1 / policy.false_alarm_budget_pairs)
        assert sum(rates) == pytest.approx(policy.aggregate_share / policy.false_alarm_budget_pairs)


async def test_live_echo_noise_pairs_do_not_feed_the_floor() -> None:
    from quantdrift.breaker import Policy, StreamFold, offline_store

    store = offline_store()
    fold = StreamFold(store, Policy())
    echo = Metrics(cosine=1.0, first_divergence=None, candidate_tokens=5, reference_tokens=5)
    differs = Metrics(cosine=0.9, first_divergence=2, candidate_tokens=5, reference_tokens=5)
    for i, m in enumerate([echo, echo, differs]):
        noise = ScoreEvent(
            pair_id=f"n{i}", route="r", kind="noise", ts=0, decoding="greedy", metrics=m
        )  # type: ignore[arg-type]
        await fold.fold(noise, now=float(i))
    assert store.floors[("r", "greedy")].values["cosine"] == (0.9,)


@pytest.mark.long
def test_a_routes_calibration_mix_ratio_widens_its_null_through_the_judge() -> None:
    # A route whose traffic may move further from the calibration's prompt mix says so
    # (calibration_mix_ratio); traffic that sits between the default's null and the
    # wider one is rolled back by the default and kept by the route that allowed it.
    from pydantic import ValidationError

    from quantdrift.breaker.rules.tolerance import null_mean

    rng = np.random.default_rng(11)
    floor = NoiseFloorState({"blessed:tf_kl": tuple(float(v) for v in rng.uniform(0, 0.8, 40))})
    default, wide = RoutePolicy(), RoutePolicy(calibration_mix_ratio=3.0)
    probe = shadow(0, Metrics(tf_kl=0.1, candidate_tokens=40))
    low, high = null_mean(default, "tf_kl", probe, floor), null_mean(wide, "tf_kl", probe, floor)
    assert low is not None and high is not None and low[1] == high[1] == "blessed"
    found = floor_mean(
        floor.values,
        "tf_kl",
        default.tf_kl_clip,
        default.min_floor_pairs,
        default.calibration_mix_ratio,
    )
    assert found is not None
    assert low[0] == pytest.approx(found[0] + default.tolerance_tf_kl / default.tf_kl_clip)
    assert high[0] > low[0] + 0.01, (low, high)
    traffic_mean = (low[0] + high[0]) / 2
    stream = [
        Metrics(tf_kl=default.tf_kl_clip * float(rng.random() < traffic_mean), candidate_tokens=40)
        for _ in range(20_000)
    ]
    assert run_judge(default, floor, stream), "the default null sits under the traffic"
    assert run_judge(wide, floor, stream) == []
    with pytest.raises(ValidationError):
        RoutePolicy(calibration_mix_ratio=0.9)
