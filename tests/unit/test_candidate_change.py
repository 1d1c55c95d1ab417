"""A new candidate under a live route: the pure fold restarts its evidence, once.

``fold_many`` is the one step both stores and the replay breaker call, so what is
checked here is what every store does; ``tests/contract/test_breaker_store.py``
checks that the memory and Redis stores queue the alert alike.
"""

from __future__ import annotations

from quantdrift.breaker import RoutePolicy, RouteState
from quantdrift.breaker.candidate import CandidateChange
from quantdrift.breaker.outbox import change_alert
from quantdrift.breaker.step import fold_many
from quantdrift.detectors import FailureThresholds
from quantdrift.detectors.noise_floor import NoiseFloor
from quantdrift.embedding.batch import score_events
from quantdrift.schemas import Metrics, ModelOutput, PairEvent, ScoreEvent
from quantdrift.schemas.pair import EngineInfo
from support import scores as support_scores

POLICY = RoutePolicy(min_pairs=3, consecutive_failures=3, rules=("consecutive",))
FLOOR = NoiseFloor()
OLD = "vllm/0.6.3/llama-8b-w4a16"
NEW = "vllm/0.7.0/llama-8b-w4a16"


def score(i: int, engine: str | None, ok: bool = True, kind: str = "shadow") -> ScoreEvent:
    return support_scores.score(i, ok, kind, engine=engine)


def fold_all(
    state: RouteState, scores: list[ScoreEvent]
) -> tuple[RouteState, list[CandidateChange]]:
    """Fold scores as a store does: prefix by prefix, each onto the last state."""
    changes: list[CandidateChange] = []
    pending = list(scores)
    flags = [False] * len(scores)
    while pending:
        step = fold_many(POLICY, state, {}, flags, pending, 10.0, FLOOR)
        state = step.state or state
        if step.change is not None:
            changes.append(step.change)
        pending, flags = pending[step.consumed :], flags[step.consumed :]
    return state, changes


def test_a_new_engine_restarts_the_evidence_and_reports_once() -> None:
    warmed, changes = fold_all(RouteState(), [score(i, OLD) for i in range(5)])
    assert changes == [] and warmed.pairs_seen == 5 and warmed.candidate_engine == OLD
    step = fold_many(
        POLICY, warmed, {}, [False, False], [score(5, NEW), score(6, NEW)], 11.0, FLOOR
    )
    # The prefix ends at the change, so the commit that queues the alert is its own.
    assert step.consumed == 1 and step.marked == (0,)
    assert step.change is not None
    assert (step.change.previous, step.change.current, step.change.pair_id) == (OLD, NEW, "p5")
    assert step.state is not None
    assert step.state.candidate_engine == NEW
    assert step.state.pairs_seen == 1  # the new candidate's first pair, no more: warming
    assert step.state.pairs_seen < POLICY.min_pairs
    assert step.state.epoch == warmed.epoch and step.state.state == "closed"
    after, changes = fold_all(step.state, [score(6, NEW), score(7, NEW)])
    assert changes == [] and after.pairs_seen == 3


def test_failures_of_the_old_candidate_do_not_count_for_the_new() -> None:
    # Two failures: one more would trip. After the change they are forgotten.
    state, _ = fold_all(RouteState(), [score(0, OLD)] + [score(i, OLD, ok=False) for i in (1, 2)])
    assert state.rules.consecutive.n == 2
    state, changes = fold_all(state, [score(3, NEW, ok=False), score(4, NEW, ok=False)])
    assert len(changes) == 1
    assert state.state == "closed" and state.rules.consecutive.n == 2


def test_a_rolled_back_route_stays_rolled_back() -> None:
    rolled = RouteState(
        state="open", epoch=7, target="reference", locked=True, opened_at=5.0, cooldown_s=60.0,
        trips=1, pairs_seen=40, candidate_engine=OLD,
    )  # fmt: skip
    step = fold_many(POLICY, rolled, {}, [False], [score(1, NEW)], 10.0, FLOOR)
    assert step.change is not None and step.transition is None and step.state is not None
    kept = (step.state.state, step.state.epoch, step.state.target, step.state.locked)
    assert kept == ("open", 7, "reference", True)
    assert (step.state.opened_at, step.state.cooldown_s, step.state.trips) == (5.0, 60.0, 1)
    assert step.state.pairs_seen <= 1


def test_same_missing_or_first_identity_changes_nothing() -> None:
    warmed, _ = fold_all(RouteState(), [score(i, OLD) for i in range(3)])
    for same in (score(3, OLD), score(3, None), score(3, "")):
        step = fold_many(POLICY, warmed, {}, [False], [same], 11.0, FLOOR)
        assert step.change is None and step.state is not None
        assert step.state.pairs_seen == 4 and step.state.candidate_engine == OLD
    # A route whose evidence came from producers that did not say adopts the first
    # identity without restarting: there is no earlier candidate to tell it from.
    unnamed, _ = fold_all(RouteState(), [score(i, None) for i in range(3)])
    step = fold_many(POLICY, unnamed, {}, [False], [score(3, OLD)], 11.0, FLOOR)
    assert step.change is None and step.state is not None
    assert step.state.pairs_seen == 4 and step.state.candidate_engine == OLD


def test_noise_pairs_do_not_judge_the_candidate() -> None:
    warmed, _ = fold_all(RouteState(), [score(i, OLD) for i in range(3)])
    step = fold_many(POLICY, warmed, {}, [False], [score(3, NEW, kind="noise")], 11.0, FLOOR)
    assert step.change is None and step.state is None


def test_a_redelivered_change_does_not_report_twice() -> None:
    warmed, _ = fold_all(RouteState(), [score(i, OLD) for i in range(3)])
    first = fold_many(POLICY, warmed, {}, [False], [score(3, NEW)], 11.0, FLOOR)
    assert first.change is not None and first.state is not None
    # The store marked p3 seen with the restarted state; the redelivery is a dup.
    again = fold_many(POLICY, first.state, {}, [True], [score(3, NEW)], 12.0, FLOOR)
    assert again.change is None and again.outcomes == (None,)
    # Redelivered onto the state read before the commit (a lost race), in one batch:
    # the pair folds once and reports once.
    twice = fold_many(POLICY, warmed, {}, [False, False], [score(3, NEW), score(3, NEW)], 11, FLOOR)
    assert twice.consumed == 1 and twice.change is not None


def test_the_alert_names_both_candidates_and_dedupes_on_the_pair() -> None:
    step = fold_many(
        POLICY, RouteState(candidate_engine=OLD), {}, [False], [score(9, NEW)], 1.0, FLOOR
    )
    assert step.change is not None and step.state is not None
    alert = change_alert("r", step.change, step.state, 1.0)
    assert (alert.kind, alert.severity) == ("breaker.candidate_changed", "P2")
    assert (alert.evidence["previous"], alert.evidence["current"]) == (OLD, NEW)
    assert alert.dedupe_key == change_alert("r", step.change, step.state, 2.0).dedupe_key
    assert alert.dedupe_key == "r:candidate_changed:p9"


def test_the_score_handler_carries_the_candidates_engine() -> None:
    engine = EngineInfo(engine="vllm", version="0.7.0", model="m", system_fingerprint="fp_x")
    pairs = [
        PairEvent(
            pair_id=f"q{i}",
            ts=1.0,
            route="r",
            candidate=ModelOutput(text="a", engine=engine if i == 0 else None),
            reference=ModelOutput(text="a", engine=EngineInfo(engine="vllm", version="0.6.3")),
        )
        for i in range(2)
    ]
    scores = score_events(pairs, [Metrics(cosine=1.0)] * 2, lambda _route: FailureThresholds())
    # The reference's engine is not the candidate's; the fingerprint is left out.
    assert [s.candidate_engine for s in scores] == ["vllm/0.7.0/m", None]
    assert ScoreEvent.parse(scores[0].dumps()).candidate_engine == "vllm/0.7.0/m"
