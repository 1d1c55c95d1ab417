"""A new candidate under a live route: its evidence starts over.

A route's evidence (windows, e-detectors, pairs seen) is about the candidate that
produced it. When the engine, its version or the weights serving the candidate
change (``ScoreEvent.candidate_engine``), that evidence says nothing about what
now serves: trusting it would let a new build ride on an old build's clean record.
So the first score of a new candidate restarts the evidence (the route is warming
again) and on-call hears of it, while what the breaker already decided stays: the
state, epoch, target and lock of a route rolled back stay as they are.
"""

from __future__ import annotations

from dataclasses import dataclass

from quantdrift.breaker.rules import RuleStates
from quantdrift.breaker.state import ReadinessState, RouteState
from quantdrift.schemas.score import ScoreEvent


@dataclass(frozen=True, slots=True)
class CandidateChange:
    """The score ``pair_id`` came from ``current``; the route's evidence was ``previous``'s."""

    previous: str
    current: str
    pair_id: str


def observe(
    state: RouteState, score: ScoreEvent, now: float
) -> tuple[RouteState, CandidateChange | None]:
    """The state a shadow score folds onto, and the change it revealed, if any.

    A score without an identity (an older producer, a server that does not say)
    changes nothing. The first identity a route sees is adopted without restarting:
    the route's evidence so far may be that candidate's, and there is no earlier
    one to tell it from.
    """
    current = score.candidate_engine
    if not current or current == state.candidate_engine:
        return state, None
    if not state.candidate_engine:
        return state.evolve(candidate_engine=current), None
    change = CandidateChange(state.candidate_engine, current, score.pair_id)
    return restart(state, current, now), change


def restart(state: RouteState, engine: str, now: float) -> RouteState:
    """The route as a new candidate finds it: decisions kept, evidence gone.

    Kept: the breaker state, epoch, target, lock, cool-down clock and trip count
    (a rollback is not undone by a redeploy; restoring stays the half-open probe's
    job). Gone: pairs seen, failures, window, sequential and tolerance tests, the
    worst pairs and half-open passes, all of which were the old candidate's; what its
    pairs carried (a new engine may not teacher-force) and its "not armed" alert. The
    floor-less tests already reported stay reported: the floor is the route's.
    """
    return state.evolve(
        pairs_seen=0,
        first_pair_at=None,
        last_pair_at=None,
        rules=RuleStates(),
        worst=(),
        last_decision="",
        last_similarity=None,
        updated_at=now,
        candidate_engine=engine,
        readiness=ReadinessState(noted=state.readiness.noted),
    )
