"""The slice rule: one budget over the route and its slices, insufficient data, pooling.

Pairs go through ``judge`` (the pure fold every store runs), as a worker folds them.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from quantdrift.breaker import RouteState, judge
from quantdrift.breaker.machine import initial_state
from quantdrift.breaker.memory_store import MemoryBreakerStore
from quantdrift.breaker.policy import RoutePolicy
from quantdrift.breaker.rules.slices import OTHER, report
from quantdrift.detectors.noise_floor import NoiseFloor
from quantdrift.detectors.tolerance import clopper_pearson
from quantdrift.schemas import Metrics, ScoreEvent
from quantdrift.schemas.signing import CommandSigner

LANGUAGES = ("en", "es", "zh", "ja", "ko", "latin", "cyrillic", "arabic")  # 8 slices


def shadow(i: int, m: Metrics, tags: dict[str, str]) -> ScoreEvent:
    return ScoreEvent(
        pair_id=f"p{i}", route="r", kind="shadow", ts=float(i), decoding="greedy",
        metrics=m, tags=tags,
    )  # fmt: skip


def boundary(rng: np.random.Generator, policy: RoutePolicy) -> Metrics:
    """A pair of the hardest healthy candidate: hard failures at exactly the tolerated
    rate, and candidate-only task failures exactly δ above the reference's."""
    return Metrics(
        repetition_run=6 * int(rng.random() < policy.tolerance_hard),
        candidate_tokens=40,
        json_ok=not rng.random() < policy.tolerance_outcomes,
        reference_json_ok=True,
    )


def first_trip(policy: RoutePolicy, scores: list[ScoreEvent]) -> tuple[int, str] | None:
    state = initial_state(policy)
    for i, s in enumerate(scores):
        d = judge(policy, state, s, float(i), None, NoiseFloor())
        state = d.state
        if d.transition is not None and d.transition.to_state == "open":
            return i, d.transition.rule
    return None


@pytest.mark.slow  # 60,000 pairs through the judge: ~15 s
def test_eight_slices_at_the_null_boundary_stay_within_the_routes_alpha() -> None:
    # One false-rollback budget B for the route: over a horizon of N healthy pairs its
    # false-rollback probability is at most alpha = N / B, aggregate and 8 slices together
    # (docs/deciding.md, "Slices"). 200 independent seeded streams of N pairs; the
    # streams with a false rollback are Binomial(200, p), and p <= alpha must hold at 95 %
    # by the exact (Clopper-Pearson) upper bound (measured: 4 of 200, upper 0.045).
    horizon, budget, streams = 300, 3000.0, 200
    alpha = horizon / budget
    policy = RoutePolicy(
        false_alarm_budget_pairs=budget,
        slice_dimensions=("language",),
        slice_max_values=len(LANGUAGES) + 1,
        budget_split={"hard": 0.5, "outcomes": 0.5},
        min_pairs=1,
        slice_min_pairs=1,
    )
    hits, rules = 0, []
    for k in range(streams):
        rng = np.random.default_rng([39, k])
        scores = [
            shadow(i, boundary(rng, policy), {"language": LANGUAGES[rng.integers(8)]})
            for i in range(horizon)
        ]
        trip = first_trip(policy, scores)
        if trip is not None:
            hits += 1
            rules.append(trip[1])
    upper = clopper_pearson(hits, streams, 0.05)[1]
    assert upper <= alpha, (hits, round(upper, 4), alpha, rules)


def confined_drift(seed: int, n: int) -> list[ScoreEvent]:
    """10 % of the traffic is Chinese, and only there the candidate loops on 30 % of
    answers; the rest is healthy."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        zh = rng.random() < 0.10
        loops = zh and rng.random() < 0.30
        m = Metrics(repetition_run=8 if loops else 0, candidate_tokens=40)
        out.append(shadow(i, m, {"language": "zh" if zh else "en", "length": "short"}))
    return out


@pytest.mark.long
def test_a_drift_confined_to_one_slice_is_caught_by_its_slice_sooner() -> None:
    # The default policy (slices on, the default budget) against the aggregate alone
    # with the whole budget, on the same seeded streams.
    with_slices, alone = RoutePolicy(), RoutePolicy(slice_dimensions=())
    zh_delays = []
    for seed in range(10):
        scores = confined_drift(seed, 3000)
        sliced = first_trip(with_slices, scores)
        aggregate = first_trip(alone, scores)
        assert sliced is not None
        at, rule = sliced
        assert rule == "tolerance:hard@language=zh"  # the alarm names the slice
        zh_delays.append(sum(1 for s in scores[: at + 1] if s.tags["language"] == "zh"))
        assert aggregate is None or aggregate[0] > at, (seed, at, aggregate)
    # The slice's own pairs until the rollback: at least slice_min_pairs (20), and
    # within 30 on most streams (median 28 of 20 20 20 20 27 28 31 36 41 60).
    assert min(zh_delays) >= 20 and sorted(zh_delays)[len(zh_delays) // 2] <= 30, zh_delays


def test_a_slice_below_its_minimum_is_insufficient_data_and_cannot_roll_back() -> None:
    policy = RoutePolicy(slice_min_pairs=20, slice_dimensions=("language",))
    state = initial_state(policy)
    looping = Metrics(repetition_run=8, candidate_tokens=40)
    healthy = Metrics(candidate_tokens=40)
    # One Chinese pair in twenty, every one looping: diluted, the aggregate does not
    # cross; the zh slice does, but with 15 of its 20 pairs it may not roll back yet.
    scores = [
        shadow(i, looping, {"language": "zh"}) if i % 20 == 19 else
        shadow(i, healthy, {"language": "en"})
        for i in range(300)
    ]  # fmt: skip
    for i, s in enumerate(scores):
        d = judge(policy, state, s, float(i))
        assert d.transition is None, (i, d.transition)
        state = d.state
    rows = {r["slice"]: r for r in report(policy, state.rules.slices)}
    assert rows["language=zh"]["status"] == "insufficient_data"
    assert rows["language=zh"]["pairs"] == 15 and rows["language=zh"]["early"] == "hard"
    assert rows["language=en"]["status"] == "testing"
    # Its early crossing is kept: the slice's 20th pair trips it, whatever it shows.
    for i in range(5):
        d = judge(policy, state, shadow(300 + i, healthy, {"language": "zh"}), 300.0 + i)
        state = d.state
        if d.transition is not None:
            break
    assert d.transition is not None and d.transition.rule == "tolerance:hard@language=zh"
    assert d.transition.evidence["slice"] == {"dimension": "language", "value": "zh", "pairs": 20}


def test_a_flood_of_tag_values_pools_into_other_and_state_survives_json() -> None:
    policy = RoutePolicy(slice_dimensions=("task", "language"), slice_max_values=4)
    state: RouteState = initial_state(policy)
    for i in range(500):
        tags = {"task": f"t{i}", "language": LANGUAGES[i % 8]}
        state = judge(policy, state, shadow(i, Metrics(candidate_tokens=40), tags), float(i)).state
        again = RouteState.from_json(json.loads(json.dumps(state.to_json())))
        assert again == state
    slices = state.rules.slices
    assert slices.values == {"task": ("t0", "t1", "t2"), "language": ("en", "es", "zh")}
    assert slices.pairs["task=other"] == 497 and slices.pairs["language=other"] == 500 - 189
    assert len(slices.tests) == 8  # 4 values a dimension, "other" included
    assert {r["value"] for r in report(policy, slices)} >= {OTHER}


async def test_the_alert_names_the_slice_that_fired() -> None:
    # Through the store every worker folds with: the alert on-call reads says which slice.
    store = MemoryBreakerStore(CommandSigner("k1", b"k" * 32))
    policy = RoutePolicy()
    result = None
    for i, s in enumerate(confined_drift(2, 3000)):
        result = await store.fold(s, policy, float(i))
        if result.outbox is not None:
            break
    assert result is not None and result.outbox is not None
    alert = result.outbox.alert
    assert alert.evidence["rule"] == "tolerance:hard@language=zh"
    assert alert.evidence["slice"]["dimension"] == "language"
    assert alert.evidence["slice"]["value"] == "zh" and alert.evidence["slice"]["pairs"] >= 20
    assert "slice language=zh" in alert.summary
