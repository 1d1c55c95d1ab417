"""Readiness per rule (``breaker/readiness.py``): which tests of a route can fire, and why
the others abstain; the fold's once-only notices and its one "not armed" alert."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from quantdrift.breaker import MemoryBreakerStore, RoutePolicy, RouteState
from quantdrift.breaker.readiness import observe, readiness, rule_names
from quantdrift.breaker.state import ReadinessState
from quantdrift.breaker.step import fold_many
from quantdrift.detectors.noise_floor import NoiseFloor, NoiseFloorState
from quantdrift.schemas import Metrics, ScoreEvent
from quantdrift.schemas.signing import CommandSigner

DEFAULT = RoutePolicy()
ALL_CARRIED = {"tf_kl": 25, "dissimilarity": 25, "lexical": 25, "entropy": 25}
VARIED = tuple(0.01 + 0.01 * i for i in range(12))  # 12 values with a spread
FLAT = (0.0,) * 12  # enough values, no spread: greedy echoes of teacher-forced KL


def floor(**values: tuple[float, ...]) -> NoiseFloorState:
    return NoiseFloorState({k.replace("blessed_", "blessed:"): v for k, v in values.items()})


def state(
    pairs: int = 25, carried: dict[str, int] | None = None, mode: str = "sampled"
) -> RouteState:
    record = ReadinessState(carried=dict(ALL_CARRIED if carried is None else carried))
    if pairs:
        record = ReadinessState(carried=record.carried, modes={mode: pairs})
    return RouteState(target="candidate", pairs_seen=pairs, readiness=record)


@dataclass(frozen=True)
class Case:
    name: str
    rule: str
    status: str
    missing: tuple[str, ...] = ()
    reason: str = ""  # a part of the first reason
    relied_on: bool = True
    policy: RoutePolicy = DEFAULT
    route: RouteState = field(default_factory=state)
    floors: dict[str, NoiseFloorState] = field(default_factory=dict)


CASES = [
    Case("below min_pairs", "tolerance:hard", "abstains", ("min_pairs",), "5 of 20",
         route=state(5)),
    Case("hard after min_pairs", "tolerance:hard", "can_fire"),
    Case("outcomes after min_pairs", "tolerance:outcomes", "can_fire"),
    Case("tf_kl without floor", "tolerance:tf_kl", "abstains", ("floor",),
         "no floor: 0 of 10 sampled noise pairs"),
    Case("tf_kl, k of n noise pairs", "tolerance:tf_kl", "abstains", ("floor",),
         "no floor: 4 of 10 sampled noise pairs", floors={"sampled": floor(tf_kl=VARIED[:4])}),
    Case("tf_kl with a floor", "tolerance:tf_kl", "can_fire",
         floors={"sampled": floor(tf_kl=VARIED)}),
    Case("tf_kl with a blessing only", "tolerance:tf_kl", "can_fire",
         floors={"sampled": floor(blessed_tf_kl=VARIED)}),
    Case("tf_kl: pairs carry no teacher-forced logprobs", "tolerance:tf_kl", "abstains",
         ("teacher_forcing",), "no teacher forcing on this pool", relied_on=False,
         route=state(carried={"lexical": 25}), floors={"sampled": floor(tf_kl=VARIED)}),
    Case("tf_kl: relied on by the policy, not carried", "tolerance:tf_kl", "abstains",
         ("teacher_forcing", "floor"), "no teacher forcing on this pool",
         policy=RoutePolicy(relies_on=("tf_kl",)), route=state(carried={})),
    Case("tf_kl: off in the policy", "tolerance:tf_kl", "abstains", ("teacher_forcing",),
         "off in the route's policy", relied_on=False,
         policy=RoutePolicy(teacher_forced=False), route=state(carried={"lexical": 25})),
    Case("entropy: no logprobs", "tolerance:entropy", "abstains", ("logprobs", "floor"),
         "no logprobs", relied_on=False, route=state(carried={"lexical": 25})),
    Case("dissimilarity: no embedder", "tolerance:dissimilarity", "abstains",
         ("embedder",), "no embedder", relied_on=False,
         route=state(carried={"lexical": 25}), floors={"sampled": floor(cosine=VARIED)}),
    Case("greedy floor that never varies: no blessing", "tolerance:tf_kl", "abstains",
         ("blessing",), "no blessing: 12 greedy noise pairs", route=state(mode="greedy"),
         floors={"greedy": floor(tf_kl=FLAT)}),
    Case("greedy, no noise at all: a blessing is what it needs", "tolerance:lexical",
         "abstains", ("blessing",), "no blessing: 0 greedy noise pairs",
         route=state(mode="greedy")),
    Case("greedy with a blessed baseline", "tolerance:tf_kl", "can_fire",
         route=state(mode="greedy"), floors={"greedy": floor(tf_kl=FLAT, blessed_tf_kl=VARIED)}),
    Case("sequential: k of n noise pairs", "sequential", "abstains", ("floor",),
         "no floor: 12 of 30 sampled noise pairs", policy=RoutePolicy(rules=("sequential",)),
         floors={"sampled": floor(cosine=VARIED)}),
    Case("sequential with its floor", "sequential", "can_fire",
         policy=RoutePolicy(rules=("sequential",)),
         floors={"sampled": floor(cosine=VARIED * 3)}),
    Case("consecutive after min_pairs", "consecutive", "can_fire",
         policy=RoutePolicy(rules=("consecutive",))),
    Case("window below min_pairs", "window", "abstains", ("min_pairs",),
         policy=RoutePolicy(rules=("window",)), route=state(3)),
    Case("not relied on when the policy names others", "tolerance:lexical", "abstains",
         ("floor",), relied_on=False, policy=RoutePolicy(relies_on=("hard", "tf_kl"))),
]  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_each_rule_says_whether_it_can_fire_and_why_not(case: Case) -> None:
    ready = readiness(case.policy, case.route, case.floors)
    row = {r.rule: r for r in ready.rules}[case.rule]
    assert row.status == case.status
    assert tuple(a.missing for a in row.abstentions) == case.missing
    assert row.relied_on is case.relied_on
    if case.reason:
        assert case.reason in row.abstentions[0].reason


def test_the_default_policy_runs_every_tolerance_test() -> None:
    assert rule_names(DEFAULT) == tuple(
        f"tolerance:{s}"
        for s in ("hard", "outcomes", "tf_kl", "dissimilarity", "lexical", "entropy")
    )


def test_a_route_without_its_floor_is_partly_armed_and_names_it() -> None:
    ready = readiness(DEFAULT, state(74), {})
    assert not ready.armed and ready.label == "partly armed"
    assert [m.split(":")[1] for m in ready.missing] == [
        "tf_kl",
        "dissimilarity",
        "lexical",
        "entropy",
    ]
    assert "no floor: 0 of 10 sampled noise pairs" in ready.summary()


def test_a_route_with_every_floor_is_armed() -> None:
    full = floor(tf_kl=VARIED, cosine=VARIED, rougeL=VARIED, abs_entropy_shift=VARIED)
    ready = readiness(DEFAULT, state(74), {"sampled": full})
    assert ready.armed and ready.label == "armed" and ready.missing == ()
    assert ready.summary().startswith("armed: 74 shadow pairs")


def test_a_mode_without_its_floor_keeps_the_route_partly_armed() -> None:
    route = state(40, carried={"lexical": 40}).evolve(
        readiness=ReadinessState(carried={"lexical": 40}, modes={"greedy": 10, "sampled": 30})
    )
    ready = readiness(DEFAULT, route, {"sampled": floor(rougeL=VARIED)})
    assert not ready.armed
    assert ready.missing == (
        "tolerance:lexical: no blessing: 0 greedy noise pairs with rougeL and no spread "
        "among them; a greedy floor needs a blessed baseline of 10 pairs "
        "(quantdrift calibrate --blessed-label)",
    )


def test_warming_names_the_missing_floor_too() -> None:
    ready = readiness(DEFAULT, state(3, carried={"lexical": 3}), {})
    assert ready.label == "warming"
    assert ready.summary() == (
        "warming: 3 of 20 shadow pairs seen; abstaining: "
        "tolerance:lexical: no floor: 0 of 10 sampled noise pairs"
    )


# --- the fold: counts, notices once, one alert --------------------------------------------


def score(i: int, tf_kl: float | None = 0.02, decoding: str = "sampled") -> ScoreEvent:
    return ScoreEvent(
        pair_id=f"p{i}",
        route="r",
        kind="shadow",
        ts=float(i),
        decoding=decoding,  # type: ignore[arg-type]
        metrics=Metrics(rougeL=0.6, tf_kl=tf_kl),
        verdict="ok",
    )


def test_observe_counts_what_the_pairs_carry_and_notes_a_floorless_test_once() -> None:
    route, seen = observe(DEFAULT, RouteState(pairs_seen=1), score(0), None)
    assert route.readiness.carried == {"tf_kl": 1, "lexical": 1}
    assert route.readiness.modes == {"sampled": 1}
    assert [n.split(":")[1] for n in seen.notices] == ["tf_kl", "lexical"]
    route, again = observe(DEFAULT, route.evolve(pairs_seen=2), score(1), None)
    assert again.notices == () and route.readiness.carried["tf_kl"] == 2


def test_observe_alerts_once_after_unarmed_alert_pairs() -> None:
    policy = RoutePolicy(unarmed_alert_pairs=30)
    route, alerts = RouteState(target="candidate"), []
    for i in range(60):
        route, seen = observe(policy, route.evolve(pairs_seen=i + 1), score(i), None)
        if seen.not_armed:
            alerts.append((i + 1, seen.not_armed))
    assert [n for n, _ in alerts] == [30]
    assert alerts[0][1][0].startswith("tolerance:tf_kl: no floor: 0 of 10")
    assert route.readiness.alerted


def test_no_alert_for_an_armed_route() -> None:
    policy = RoutePolicy(unarmed_alert_pairs=20)
    full = floor(tf_kl=VARIED, rougeL=VARIED)
    route = RouteState(target="candidate")
    for i in range(30):
        route, seen = observe(policy, route.evolve(pairs_seen=i + 1), score(i), full)
        assert seen.not_armed == () and seen.notices == ()
    assert route.readiness.missing == () and not route.readiness.alerted


def test_the_store_queues_the_not_armed_alert_once_and_marks_the_state() -> None:
    """Through fold_many and the memory store: what the worker's Redis store runs too."""
    import asyncio

    async def run() -> tuple[list[bytes], RouteState]:
        store = MemoryBreakerStore(CommandSigner("k1", b"k" * 32))
        policy = RoutePolicy(unarmed_alert_pairs=25)
        for i in range(0, 60, 7):  # batches that straddle the 25th pair
            await store.fold_batch([score(j) for j in range(i, min(i + 7, 60))],
                                   lambda _r: policy, 100.0)  # fmt: skip
        return store.outboxes.get("r", []), (await store.read("r"))[0]

    items, route = asyncio.run(run())
    assert len(items) == 1 and b"breaker.not_armed" in items[0] and b"p24" in items[0]
    assert route.pairs_seen == 60 and route.readiness.alerted


def test_fold_many_ends_a_prefix_at_the_alert() -> None:
    policy = RoutePolicy(unarmed_alert_pairs=20)
    scores = [score(i) for i in range(30)]
    step = fold_many(policy, RouteState(), {}, [False] * 30, scores, 1.0, NoiseFloor())
    assert step.consumed == 20 and step.not_armed and step.transition is None


def test_a_new_candidate_restarts_the_record_but_not_the_notes() -> None:
    from quantdrift.breaker.candidate import restart

    route, _ = observe(DEFAULT, RouteState(pairs_seen=1), score(0), None)
    fresh = restart(route.evolve(readiness=route.readiness), "vllm/new", 5.0)
    assert fresh.readiness.carried == {} and fresh.readiness.noted == route.readiness.noted


def test_state_round_trips_through_json() -> None:
    route, _ = observe(DEFAULT, RouteState(pairs_seen=1), score(0), None)
    import orjson

    assert RouteState.from_json(orjson.loads(orjson.dumps(route.to_json()))) == route


def test_a_policy_cannot_rely_on_a_test_it_does_not_run() -> None:
    with pytest.raises(ValueError, match="relies_on names 'sequential'"):
        RoutePolicy(relies_on=("sequential",))
    with pytest.raises(ValueError, match="relies_on names 'tf_kl'"):
        RoutePolicy(rules=("consecutive",), relies_on=("tf_kl",))
