"""The breaker's lifecycle: fold one score into a route's state. Pure, no I/O, no clock.

``judge`` reads the score once (``rules.read``), hands the reading to the rules of
the route's state (closed: the rules the policy lists, in its order, the first
alarm winning; half-open: the probe) and turns an alarm into a transition; ``tick``
half-opens a route whose cool-down is over; ``manual`` is the operator's. Each
rule, and the state it keeps, is in :mod:`quantdrift.breaker.rules`. Stores fold
scores only through :func:`quantdrift.breaker.step.fold_many`, which ticks first.
"""

from __future__ import annotations

from dataclasses import replace

from quantdrift.breaker import rules, slice_scope, worst
from quantdrift.breaker.policy import RoutePolicy
from quantdrift.breaker.rules import RuleStates, similarity_of
from quantdrift.breaker.state import (
    BreakerState,
    Decision,
    RouteState,
    Transition,
    next_epoch,
    target_hint,
)
from quantdrift.detectors.noise_floor import NoiseFloor, NoiseFloorState, metric_values
from quantdrift.schemas.command import Target
from quantdrift.schemas.score import ScoreEvent

__all__ = [
    "Decision",
    "initial_state",
    "judge",
    "manual",
    "next_epoch",
    "similarity_of",
    "target_hint",
    "tick",
]


def initial_state(policy: RoutePolicy) -> RouteState:
    return RouteState(target="candidate", cooldown_s=policy.cooldown_s)


def judge(
    policy: RoutePolicy,
    state: RouteState,
    score: ScoreEvent,
    now: float,
    floor: NoiseFloorState | None = None,
    noise_floor: NoiseFloor = NoiseFloor(),
) -> Decision:
    """Fold one shadow score into the route's state; noise scores never reach here."""
    if not state.target:
        state = state.evolve(target="candidate", cooldown_s=policy.cooldown_s)
    pair = rules.read(policy, score, floor)
    state = state.evolve(
        pairs_seen=state.pairs_seen + 1,
        **_window(state, score.ts),
        last_similarity=pair.similarity,
        updated_at=now,
        worst=worst.keep(state.worst, pair, policy),
    )
    if state.locked or state.state == "open":
        # Locked routes follow the operator; open routes serve the reference, and
        # candidate pairs still in flight from before the trip say nothing new.
        return Decision(state.evolve(last_decision="ignored"))
    if state.state == "half_open":
        return _probe(policy, state, pair)
    held = slice_scope.holding(state, score.tags)
    if held is not None:
        # A slice rolled back on its own: its pairs are its breaker's, not the route's.
        return _widened(policy, state, slice_scope.judge_held(policy, state, held, pair))
    return _closed(policy, state, pair, noise_floor, now)


def _widened(
    policy: RoutePolicy, state: RouteState, step: Decision | slice_scope.Widen
) -> Decision:
    """A slice's decision, or the route's trip when the slice's rollback widens."""
    if isinstance(step, Decision):
        return step
    numbers = {**step.evidence, "widened": True}
    return _trip(policy, state, step.rule, step.reason, numbers, state.updated_at)


def _closed(
    policy: RoutePolicy, state: RouteState, pair: rules.Pair, noise_floor: NoiseFloor, now: float
) -> Decision:
    """Every rule the policy lists folds the pair; after ``min_pairs``, the first
    alarm in the policy's order trips the route."""
    evidence, fired = rules.run(rules.closed_rules(policy, noise_floor), state.rules, pair)
    score = pair.score
    state = state.evolve(rules=evidence, last_decision="ok" if not pair.failing else pair.verdict)
    if state.pairs_seen < policy.min_pairs or fired is None:
        return Decision(state)
    effects = {}
    if pair.floor is not None:
        effects = noise_floor.effect_sizes(pair.floor, metric_values(score.metrics))
    numbers = {**fired.evidence, "decisive_pair_id": score.pair_id, "effect_sizes": effects}
    where = slice_scope.scoped_slice(policy, fired)
    if where is not None:
        return _widened(policy, state, slice_scope.trip(policy, state, where, fired, numbers, now))
    return _trip(policy, state, fired.rule, fired.reason, numbers, now)


def _trip(
    policy: RoutePolicy,
    state: RouteState,
    rule: str,
    reason: str,
    numbers: dict[str, object],
    now: float,
) -> Decision:
    from_state = state.state
    cooldown = policy.cooldown_s if from_state == "closed" else state.cooldown_s
    if from_state == "half_open":
        cooldown = min(state.cooldown_s * policy.cooldown_backoff, policy.max_cooldown_s)
    evidence = {
        **numbers,
        "rule": rule,
        "pairs_seen": state.pairs_seen,
        "cooldown_s": cooldown,
        "worst_pairs": worst.evidence(state.worst, policy.worst_pairs_kept),
    }
    new = _reset_counters(state).evolve(
        state="open",
        epoch=next_epoch(state.epoch, now),
        target="reference",
        opened_at=now,
        cooldown_s=cooldown,
        trips=state.trips + 1,
        last_decision=f"trip:{rule}",
    )
    return Decision(
        new,
        Transition(
            from_state,
            "open",
            "rollback",
            "reference",
            rule,
            reason,
            evidence,
            target_hint(policy, "reference"),
        ),
    )


def _probe(policy: RoutePolicy, state: RouteState, pair: rules.Pair) -> Decision:
    """Half-open: the candidate runs in shadow behind the reference and must prove itself."""
    probe = rules.HalfOpenProbe(policy.half_open_pairs)
    passed, fired = probe.update(state.rules.half_open, pair)
    if fired is not None:
        return _trip(policy, state, fired.rule, fired.reason, fired.evidence, state.updated_at)
    if not probe.proven(passed):
        evidence = replace(state.rules, half_open=passed)
        return Decision(state.evolve(rules=evidence, last_decision="probe_pass"))
    new = _reset_counters(state).evolve(
        state="closed",
        epoch=next_epoch(state.epoch, state.updated_at),
        target="candidate",
        opened_at=None,
        cooldown_s=policy.cooldown_s,
        last_decision="restored",
    )
    reason = f"{passed.passes} passing shadow pairs in half-open"
    return Decision(
        new,
        Transition(
            "half_open",
            "closed",
            "restore",
            "candidate",
            "half_open_probe",
            reason,
            {"passes": passed.passes},
            target_hint(policy, "candidate"),
        ),
    )


def tick(policy: RoutePolicy, state: RouteState, now: float) -> Decision:
    """Time passing: an open route whose cool-down is over goes half-open; on a closed
    route, a held slice's (``slice_scope.tick``)."""
    if not state.locked and state.state == "closed" and state.held:
        return slice_scope.tick(policy, state, now) or Decision(state)
    if state.locked or state.state != "open" or state.opened_at is None:
        return Decision(state)
    if now - state.opened_at < state.cooldown_s:
        return Decision(state)
    new = _reset_counters(state).evolve(
        state="half_open",
        epoch=next_epoch(state.epoch, now),
        last_decision="half_open",
        updated_at=now,
    )
    reason = f"cool-down of {state.cooldown_s:g} s over: candidate runs in shadow"
    return Decision(
        new,
        Transition(
            "open",
            "half_open",
            "canary",
            "reference",
            "cooldown",
            reason,
            {"cooldown_s": state.cooldown_s, "percent": 0.0},
            target_hint(policy, "reference"),
        ),
    )


def manual(
    policy: RoutePolicy, state: RouteState, action: str, now: float, who: str = "cli"
) -> Decision:
    """An operator's rollback / restore (locks the route) or release (unlocks it)."""
    if not state.target:
        state = initial_state(policy)
    if action == "release":
        new = state.evolve(
            locked=False,
            epoch=next_epoch(state.epoch, now),
            last_decision="released",
            updated_at=now,
        )
        side: Target = "candidate" if new.state == "closed" else "reference"
        transition = Transition(
            state.state,
            new.state,
            "restore" if new.state == "closed" else "rollback",
            side,
            "manual",
            f"lock released by {who}",
            {"who": who},
            target_hint(policy, side),
        )
        return Decision(new, transition)
    to_state: BreakerState = "open" if action == "rollback" else "closed"
    target: Target = "reference" if action == "rollback" else "candidate"
    new = _reset_counters(state).evolve(
        state=to_state,
        epoch=next_epoch(state.epoch, now),
        target=target,
        locked=True,
        opened_at=now if to_state == "open" else None,
        last_decision=f"manual:{action}",
        updated_at=now,
    )
    transition = Transition(
        state.state,
        to_state,
        "rollback" if action == "rollback" else "restore",
        target,
        "manual",
        f"manual {action} by {who}; route locked",
        {"who": who},
        target_hint(policy, target),
    )
    return Decision(new, transition)


def _window(state: RouteState, ts: float) -> dict[str, float | None]:
    """The pairs' time window with one more pair at ``ts`` (out of order too). A state
    written before windows were kept, with pairs and no window, keeps none: a window
    from the next pair on would claim less than ``pairs_seen`` counts."""
    if state.pairs_seen == 0:
        return {"first_pair_at": ts, "last_pair_at": ts}
    if state.first_pair_at is None or state.last_pair_at is None:
        return {}
    return {
        "first_pair_at": min(state.first_pair_at, ts),
        "last_pair_at": max(state.last_pair_at, ts),
    }


def _reset_counters(state: RouteState) -> RouteState:
    """A route's transition restarts every rule's evidence and the worst pairs, and ends
    every slice's own rollback: the whole route now goes one way."""
    return state.evolve(rules=RuleStates(), worst=(), held={})
