"""Every sequential test and the route state it lives in: state survives a JSON round
trip (it lives in Redis), input is not mutated, same seed gives the same alarms, every
e-value is non-negative, and each detector carries a doctest."""

from __future__ import annotations

import copy
import math

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quantdrift.breaker import RouteState, judge
from quantdrift.breaker.machine import initial_state
from quantdrift.breaker.policy import RoutePolicy
from quantdrift.detectors import sequential, tolerance
from quantdrift.detectors.noise_floor import NoiseFloorState
from quantdrift.detectors.tolerance import BettingSR, BettingState
from quantdrift.schemas import Metrics, ScoreEvent


@settings(max_examples=200, deadline=None)
@given(
    xs=st.lists(st.floats(min_value=-1.0, max_value=2.0), min_size=1, max_size=30),
    null=st.floats(min_value=0.0, max_value=1.0),
)
def test_betting_sr_state_round_trips_and_stays_finite(xs: list[float], null: float) -> None:
    test = BettingSR(arl=1e4)
    state = test.init()
    for x in xs:
        before = copy.deepcopy(state)
        new, signal = test.update(state, x, null)
        assert state == before, "state mutated"
        assert math.isfinite(signal.statistic) or signal.statistic == -math.inf
        assert BettingState.from_json(orjson.loads(orjson.dumps(new.to_json()))) == new
        state = new


def test_betting_sr_same_seed_same_alarms() -> None:
    def alarms(seed: int) -> list[int]:
        rng = np.random.default_rng(seed)
        test, state, out = BettingSR(arl=500.0), BettingState(), []
        for i, x in enumerate(rng.beta(2.0, 5.0, 3000)):
            state, signal = test.update(state, float(x), 0.3)
            if signal.drift_detected:
                out.append(i)
                state = test.init()
        return out

    assert alarms(4) == alarms(4)


@pytest.mark.parametrize("module", [sequential, tolerance])
def test_each_detector_module_has_doctests(module: object) -> None:
    assert ">>>" in (getattr(module, "__doc__", "") or "") or any(
        ">>>" in (getattr(obj, "__doc__", "") or "") for obj in vars(module).values()
    )


def test_route_state_with_tests_survives_the_store_encoding() -> None:
    policy = RoutePolicy(min_pairs=100)
    floor = NoiseFloorState({"blessed:tf_kl": (0.001, 0.004) * 10})
    state = initial_state(policy)
    for i in range(5):
        score = ScoreEvent(
            pair_id=f"p{i}",
            route="r",
            kind="shadow",
            ts=float(i),
            decoding="greedy",
            metrics=Metrics(tf_kl=0.5, repetition_run=6, candidate_tokens=20),
        )
        state = judge(policy, state, score, float(i), floor).state
    assert set(state.rules.tolerance.tests) == {"hard", "outcomes", "tf_kl"}
    wire = orjson.dumps(state.to_json())  # what the Redis store writes
    assert RouteState.from_json(orjson.loads(wire)) == state
