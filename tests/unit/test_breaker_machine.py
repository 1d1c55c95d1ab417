"""The decision rules as plain functions: seeded streams, golden indices."""

from __future__ import annotations

import pytest

from quantdrift.breaker import (
    Policy,
    RoutePolicy,
    RouteState,
    StreamFold,
    judge,
    manual,
    offline_store,
    tick,
)
from quantdrift.breaker.machine import initial_state
from quantdrift.detectors.noise_floor import NoiseFloor
from quantdrift.schemas import Metrics, ScoreEvent

POLICY = RoutePolicy(
    min_pairs=5,
    cooldown_s=10,
    half_open_pairs=3,
    candidate_precision="int4",
    reference_precision="bf16",
    rules=("consecutive", "window"),
)


def score(i: int, cosine: float, verdict: str = "ok", kind: str = "shadow") -> ScoreEvent:
    """A score whose metrics show its verdict (the judge reads the metrics, not the
    verdict on the wire): an ``anomaly`` has a looping tail the reference lacks."""
    reasons = [] if verdict == "ok" else [f"cosine {cosine:.2f} < 0.88"]
    loop = {"looping": True} if verdict == "anomaly" else {}
    return ScoreEvent(
        pair_id=f"p{i}",
        route="r",
        kind=kind,
        ts=float(i),
        decoding="greedy",  # unknown decoding counts as sampled
        metrics=Metrics(cosine=cosine, **loop),
        verdict=verdict,
        reasons=reasons,
    )


def run(policy: RoutePolicy, scores: list[ScoreEvent]) -> list[tuple[int, str]]:
    state, events = initial_state(policy), []
    for i, s in enumerate(scores):
        d = judge(policy, state, s, now=float(i))
        state = d.state
        if d.transition:
            events.append((i, d.transition.to_state))
    return events


def test_healthy_stream_never_trips() -> None:
    assert run(POLICY, [score(i, 0.95) for i in range(200)]) == []


def test_three_consecutive_failures_trip_once_after_min_pairs() -> None:
    stream = [score(i, 0.95) for i in range(10)] + [score(10 + i, 0.5, "drift") for i in range(10)]
    assert run(POLICY, stream) == [(12, "open")]


def test_no_rule_fires_before_min_pairs() -> None:
    policy = POLICY.model_copy(update={"min_pairs": 8})
    stream = [score(i, 0.5, "drift") for i in range(10)]
    assert run(policy, stream) == [(7, "open")]


def test_window_rule_on_mean_similarity_without_consecutive_failures() -> None:
    policy = POLICY.model_copy(update={"rules": ("window",), "window_size": 10})
    # Alternating 0.70 / 0.95: never 3 failures in a row, but after min_pairs (5) the
    # window mean is (3 * 0.70 + 2 * 0.95) / 5 = 0.80 < 0.85.
    stream = [score(i, 0.95 if i % 2 else 0.70, "ok" if i % 2 else "drift") for i in range(30)]
    assert run(policy, stream) == [(4, "open")]


@pytest.mark.parametrize("failing", [True, False])
def test_half_open_probe(failing: bool) -> None:
    state = initial_state(POLICY)
    for i in range(8):
        state = judge(POLICY, state, score(i, 0.5, "drift"), now=float(i)).state
    assert state.state == "open" and state.target == "reference"
    first_epoch = state.epoch
    assert tick(POLICY, state, now=state.opened_at + 5).transition is None
    d = tick(POLICY, state, now=state.opened_at + 10)
    assert d.transition and d.transition.action == "canary" and d.state.state == "half_open"
    state = d.state
    if failing:
        d = judge(POLICY, state, score(100, 0.4, "drift"), now=200.0)
        assert d.state.state == "open" and d.state.cooldown_s == 20  # backoff x2
    else:
        for i in range(3):
            d = judge(POLICY, state, score(100 + i, 0.97), now=200.0 + i)
            state = d.state
        assert d.transition and d.transition.action == "restore"
        assert state.state == "closed" and state.target == "candidate"
        assert state.epoch > first_epoch + 1  # trip, half-open, restore: each one newer


def test_manual_rollback_locks_route() -> None:
    d = manual(POLICY, RouteState(), "rollback", now=1.0)
    assert d.state.locked and d.state.target == "reference" and d.state.epoch == 1000
    state = d.state
    for i in range(20):
        state = judge(POLICY, state, score(i, 0.99), now=2.0 + i).state
    assert state.state == "open" and state.locked
    released = manual(POLICY, state, "release", now=30.0)
    assert not released.state.locked and released.state.epoch == 30_000


def test_state_json_round_trip() -> None:
    state = initial_state(POLICY)
    for i in range(6):
        state = judge(POLICY, state, score(i, 0.5, "drift"), now=float(i)).state
    assert RouteState.from_json(state.to_json()) == state


# What a route's state looked like in Redis before each rule owned its slice: every
# rule's fields flat beside the lifecycle's (a window entry of two values is older still).
OLD_FLAT_STATE = {
    "state": "closed",
    "epoch": 1_700_000_000_123,
    "target": "candidate",
    "locked": False,
    "pairs_seen": 12,
    "consecutive_failures": 2,
    "window": [[0.91, False, None], [0.4, True, 0.3], [0.5, False]],
    "seq_n": 7,
    "seq_log_m": 1.25,
    "opened_at": None,
    "cooldown_s": 10.0,
    "half_open_passes": 0,
    "trips": 1,
    "worst": [{"pair_id": "p3", "similarity": 0.4, "reasons": ["cosine 0.40 < 0.88"]}],
    "last_decision": "drift",
    "last_similarity": 0.5,
    "updated_at": 11.0,
    "tests": {"hard": [3.0, 1.0, -0.5, 0.25]},
    "early": "hard",
    "candidate_engine": "vllm/0.6.3/m",
}


def test_a_route_written_in_the_old_flat_layout_keeps_its_state_and_evidence() -> None:
    state = RouteState.from_json(OLD_FLAT_STATE)
    kept = (state.state, state.epoch, state.target, state.trips, state.candidate_engine)
    assert kept == ("closed", 1_700_000_000_123, "candidate", 1, "vllm/0.6.3/m")
    assert (state.pairs_seen, state.cooldown_s, state.last_decision) == (12, 10.0, "drift")
    assert state.worst[0].pair_id == "p3" and state.worst[0].reasons == ("cosine 0.40 < 0.88",)
    rules = state.rules
    assert rules.consecutive.n == 2
    assert rules.window.entries == ((0.91, False, None), (0.4, True, 0.3), (0.5, False, None))
    assert (rules.sequential.n, rules.sequential.log_m) == (7, 1.25)
    assert rules.tolerance.tests == {"hard": (3.0, 1.0, -0.5, 0.25)}
    assert rules.tolerance.early == "hard" and rules.half_open.passes == 0
    # The evidence still counts: a third failure in a row trips (K=3, min_pairs passed).
    d = judge(POLICY, state, score(13, 0.5, "drift"), now=12.0)
    assert d.transition is not None and d.transition.rule == "consecutive"
    assert d.transition.evidence["consecutive"] == 3
    # Written back in the new layout, it reads the same.
    assert RouteState.from_json(state.to_json()) == state and "rules" in state.to_json()


async def test_sequential_rule_trips_against_noise_floor_and_not_on_noise() -> None:
    policy = POLICY.model_copy(
        update={
            "rules": ("sequential",),
            "budget_split": {"sequential": 1.0},
            "min_noise_pairs": 20,
            "false_alarm_budget_pairs": 1000,
        }
    )
    fold = StreamFold(offline_store(NoiseFloor(capacity=200)), Policy(default=policy))
    import random

    rng = random.Random(7)
    noise = [(float(i), score(i, rng.uniform(0.85, 0.99), kind="noise")) for i in range(200)]
    assert await fold.fold_all(noise) == []
    # Healthy shadow pairs drawn from the noise distribution: no trip.
    healthy = [(300.0 + i, score(1000 + i, rng.uniform(0.85, 0.99))) for i in range(300)]
    assert await fold.fold_all(healthy) == []
    # Shift below every noise value, with per-pair verdicts still "ok": only the
    # sequential test can see it.
    trips = await fold.fold_all([(700.0 + i, score(5000 + i, 0.80)) for i in range(30)])
    assert trips and trips[0].transition.rule == "sequential"
    assert trips[0].index - 300 <= 10


async def test_offline_fold_counts_redelivered_pair_once() -> None:
    fold = StreamFold(offline_store(), Policy(default=POLICY))
    for _ in range(3):
        await fold.fold(score(1, 0.5, "drift"), now=1.0)
    assert (await fold.state("r")).pairs_seen == 1 and fold.shadow_pairs == {"r": 1}


def sampled(i: int, cosine: float, verdict: str = "ok") -> ScoreEvent:
    return score(i, cosine, verdict).model_copy(update={"decoding": "sampled"})


def test_sampled_pairs_fail_fixed_rules_only_as_anomalies_by_default() -> None:
    # Two samples of one model sit near cosine 0.5 (lab, SmolLM2 at T=0.7): a low
    # similarity on a sampled pair is noise for the fixed rules, not a failure.
    policy = POLICY.model_copy(update={"rules": ("consecutive", "window")})
    assert run(policy, [sampled(i, 0.5, "drift") for i in range(60)]) == []
    anomalies = [sampled(i, 0.9, "anomaly") for i in range(10)]
    assert run(policy, anomalies) == [(4, "open")]
    seeds = policy.model_copy(update={"fixed_rules_on_sampled": True})
    assert run(seeds, [sampled(i, 0.5, "drift") for i in range(60)]) == [(4, "open")]


def tf_score(i: int, tf_kl: float, cosine: float = 0.6) -> ScoreEvent:
    verdict = "drift" if tf_kl > 0.1 else "ok"
    return ScoreEvent(
        pair_id=f"t{i}",
        route="r",
        kind="shadow",
        ts=float(i),
        metrics=Metrics(cosine=cosine, tf_kl=tf_kl),
        verdict=verdict,
    )


def test_window_follows_teacher_forced_divergence_not_text_similarity() -> None:
    policy = POLICY.model_copy(update={"rules": ("window",), "window_size": 20})
    # Healthy near-ties: cosine 0.6 (far under 0.85) but divergence ~0: no trip.
    assert run(policy, [tf_score(i, 0.004) for i in range(60)]) == []
    # One wild pair counts at most 1 nat: 19 x 0.004 + 1 = 1.08 / 20 = 0.054 < 0.1.
    assert run(policy, [tf_score(i, 0.004) for i in range(19)] + [tf_score(19, 9.0)]) == []
    # A sustained shift of 0.3 nats: (13 x 0.004 + 7 x 0.3) / 20 = 0.108 > 0.1 at pair 26.
    stream = [tf_score(i, 0.004) for i in range(20)] + [tf_score(20 + i, 0.3) for i in range(20)]
    assert run(policy, stream) == [(26, "open")]


def test_epoch_grows_across_redis_loss() -> None:
    """A route whose state was lost (RouteState()) still issues a newer epoch than
    every command before the loss: the epoch follows the clock in milliseconds."""
    before = manual(POLICY, RouteState(), "rollback", now=1_000.0).state
    before = manual(POLICY, before, "restore", now=1_000.5).state
    assert before.epoch == 1_000_500
    after_loss = manual(POLICY, RouteState(), "rollback", now=1_001.0).state
    assert after_loss.epoch > before.epoch
    # Two transitions within one millisecond still get distinct, growing epochs.
    again = manual(POLICY, after_loss, "restore", now=1_001.0).state
    assert again.epoch == after_loss.epoch + 1


def test_transitions_name_roles_and_the_policy_hint() -> None:
    d = manual(POLICY, RouteState(), "rollback", now=1.0)
    assert d.transition is not None
    assert (d.transition.target, d.transition.target_precision) == ("reference", "bf16")
    bare = POLICY.model_copy(update={"candidate_precision": None, "reference_precision": None})
    d = manual(bare, RouteState(), "restore", now=1.0)
    assert d.transition is not None
    assert (d.transition.target, d.transition.target_precision) == ("candidate", None)
