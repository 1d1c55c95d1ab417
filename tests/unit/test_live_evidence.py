"""A route's live evidence as a certificate binds it: the pure fold keeps the window of
the pairs it counts, and ``breaker/evidence.py`` reads the window, the floors and the
worst pairs (by hash) from the state alone."""

from __future__ import annotations

import hashlib

from quantdrift.breaker import RoutePolicy, RouteState
from quantdrift.breaker.evidence import live_evidence
from quantdrift.breaker.step import fold_many
from quantdrift.detectors.noise_floor import NoiseFloor, NoiseFloorState
from quantdrift.schemas import Metrics, ScoreEvent

POLICY = RoutePolicy(min_pairs=3, rules=("consecutive",), worst_pairs_kept=2)


def score(i: int, ts: float, cosine: float = 0.99, engine: str = "vllm/0.31/m") -> ScoreEvent:
    return ScoreEvent(
        pair_id=f"req-{i}:shadow",
        route="r",
        kind="shadow",
        ts=ts,
        decoding="greedy",
        metrics=Metrics(cosine=cosine, rougeL=0.9),
        candidate_engine=engine,
    )


def fold(state: RouteState, *scores: ScoreEvent) -> RouteState:
    """Fold as a store does (``fold_many``: the candidate check, then the judge)."""
    pending, flags = list(scores), [False] * len(scores)
    while pending:
        step = fold_many(POLICY, state, {}, flags, pending, 1_000.0, NoiseFloor())
        state = step.state or state
        pending, flags = pending[step.consumed :], flags[step.consumed :]
    return state


def test_the_window_spans_the_pairs_counted_even_out_of_order() -> None:
    state = fold(RouteState(), score(1, 500.0), score(2, 450.0), score(3, 620.0))
    assert live_evidence(state, {})["window"] == {"first_pair_at": 450.0, "last_pair_at": 620.0}
    assert live_evidence(RouteState(), {})["window"] is None


def test_a_state_from_before_windows_keeps_none_rather_than_claim_less() -> None:
    legacy = RouteState(pairs_seen=40)  # written before the window was kept
    state = fold(legacy, score(1, 500.0))
    assert state.pairs_seen == 41 and live_evidence(state, {})["window"] is None


def test_worst_pairs_by_hash_and_floors_by_size_and_hash() -> None:
    state = fold(RouteState(), score(1, 1.0, 0.95), score(2, 2.0, 0.90), score(3, 3.0))
    worst = live_evidence(state, {})["worst_pairs"]
    assert [w["pair_sha256"] for w in worst] == [
        hashlib.sha256(b"req-2:shadow").hexdigest(),
        hashlib.sha256(b"req-1:shadow").hexdigest(),
    ]
    assert [w["similarity"] for w in worst] == [0.90, 0.95]
    floor = NoiseFloorState({"rougeL": (0.9, 0.8, 1.0), "blessed:rougeL": (0.7,)})
    (row,) = live_evidence(state, {"sampled": floor})["calibration"]
    assert (row["mode"], row["noise_pairs"], row["blessed_pairs"]) == ("sampled", 3, 1)
    assert row["sha256"] == floor.sha256() != NoiseFloorState({"rougeL": (0.9,)}).sha256()
    # The hash is of the values in order: the same values in another order are another floor.
    assert (
        NoiseFloorState({"rougeL": (0.8, 0.9, 1.0)}).sha256()
        != NoiseFloorState({"rougeL": (0.9, 0.8, 1.0)}).sha256()
    )


def test_a_new_candidate_restarts_the_window_with_its_evidence() -> None:
    state = fold(RouteState(), score(1, 100.0), score(2, 200.0))
    state = fold(state, score(3, 900.0, engine="vllm/0.32/m"))
    assert state.pairs_seen == 1
    assert live_evidence(state, {})["window"] == {"first_pair_at": 900.0, "last_pair_at": 900.0}
