"""``fold_many``: the one pure step every store (Redis, memory) and the replay breaker call."""

from __future__ import annotations

from quantdrift.breaker import RoutePolicy, RouteState
from quantdrift.breaker.step import fold_many
from quantdrift.detectors.noise_floor import NoiseFloor
from quantdrift.schemas import ScoreEvent
from support.scores import score

POLICY = RoutePolicy(min_pairs=1, consecutive_failures=3, rules=("consecutive",))
FLOOR = NoiseFloor()


def test_a_prefix_ends_at_its_first_transition() -> None:
    scores = [score(i, ok=False) for i in range(6)]
    step = fold_many(POLICY, RouteState(), {}, [False] * 6, scores, 10.0, FLOOR)
    assert step.consumed == 3  # the third failure trips; the rest fold onto the new state
    assert step.transition is not None and step.transition.to_state == "open"
    assert step.state is not None and step.state.state == "open"
    assert step.marked == (0, 1, 2)


def test_duplicates_fold_once_and_noise_feeds_only_the_floor() -> None:
    scores = [score(0), score(1, pair="p0"), score(2, kind="noise"), score(3)]
    step = fold_many(POLICY, RouteState(), {}, [False, False, False, True], scores, 1.0, FLOOR)
    assert step.consumed == 4 and step.transition is None
    assert [o is None for o in step.outcomes] == [False, True, False, True]  # in-batch, seen
    assert step.marked == (0, 2)
    assert set(step.floors) == {"greedy"}
    assert step.state is not None and step.state.pairs_seen == 1


def test_inputs_are_left_alone() -> None:
    state = RouteState()
    floors = {"greedy": FLOOR.init()}
    fold_many(POLICY, state, floors, [False], [score(0, kind="noise")], 1.0, FLOOR)
    assert state == RouteState() and floors == {"greedy": FLOOR.init()}


def test_time_passes_first_a_due_tick_is_a_prefix_of_its_own() -> None:
    """Every store ticks inside the fold (replay's behaviour, now the stores' too): an
    open route whose cool-down is over half-opens before any score folds, in a commit
    that carries that one command, and the scores fold onto the half-open state."""
    opened = RouteState(state="open", epoch=5, target="reference", opened_at=10.0, cooldown_s=5.0)
    scores = [score(0), score(1)]
    early = fold_many(POLICY, opened, {}, [False, False], scores, 14.0, FLOOR)
    assert early.transition is None and early.consumed == 2
    assert early.state is not None and early.state.state == "open"  # still cooling down
    ticked = fold_many(POLICY, opened, {}, [False, False], scores, 15.0, FLOOR)
    assert (ticked.consumed, ticked.outcomes, ticked.marked) == (0, (), ())
    assert ticked.transition is not None and ticked.transition.rule == "cooldown"
    assert ticked.state is not None and ticked.state.state == "half_open"
    probed = fold_many(POLICY, ticked.state, {}, [False, False], scores, 15.0, FLOOR)
    assert probed.transition is None and probed.consumed == 2
    assert probed.state is not None and probed.state.rules.half_open.passes == 2


def test_the_fold_records_how_sure_the_evidence_is_for_the_gateways_share() -> None:
    """``readiness.progress`` (the nearest tolerance test's log e over log threshold) grows
    with hard failures and stays low on passing pairs; ``short_slices`` counts the judged
    slice values still below ``slice_min_pairs`` (``breaker/readiness.py:sureness``)."""
    policy = RoutePolicy(min_pairs=50, rules=("tolerance",), slice_min_pairs=5,
                         slice_dimensions=("language",))  # fmt: skip

    def hard(i: int, ok: bool) -> ScoreEvent:
        s = score(i, ok)
        m = s.metrics.model_copy(update={"repetition_run": 1 if ok else 12})
        return s.model_copy(update={"metrics": m, "tags": {"language": "en" if i % 2 else "zh"}})

    def progress(ok: bool, n: int) -> tuple[float, int, int]:
        scores = [hard(i, ok) for i in range(n)]
        step = fold_many(policy, RouteState(), {}, [False] * n, scores, 1.0, FLOOR)
        assert step.state is not None and step.transition is None  # min_pairs holds alarms
        r = step.state.readiness
        return r.progress, r.short_slices, r.slices

    good, bad = progress(True, 8), progress(False, 8)
    assert good[0] < 0.25 < 0.5 < bad[0] <= 1.0, (good, bad)
    assert good[1:] == (2, 2)  # en and zh, 4 pairs each: both short of 5
    assert progress(True, 12)[1:] == (0, 2)
