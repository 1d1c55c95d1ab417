"""The one fold every store shares: scores in, new states and maybe a transition out.

:func:`fold_many` is the only place a score changes a route. It is pure. A store
reads the route's state, its floors and which pairs it has seen, calls
``fold_many``, and writes what comes back; the Redis store and the memory store
(live, and replay, eval and calibrate through ``breaker/offline.py``) both do
exactly that.

Time is part of the fold: ``fold_many`` ticks the route at ``now`` before any score
folds (an open route whose cool-down is over half-opens first), so a score that
comes after the cool-down is judged by the half-open probe in every store,
whether or not a clock ticked the route in between. Replay and eval, which have
no clock, always worked this way; the live stores now do too, and their clock
(``tick``) only moves routes that see no scores.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from quantdrift.breaker.candidate import CandidateChange, observe
from quantdrift.breaker.machine import Decision, judge, tick
from quantdrift.breaker.policy import RoutePolicy
from quantdrift.breaker.readiness import observe as observe_readiness
from quantdrift.breaker.readiness import sureness
from quantdrift.breaker.state import RouteState, Transition
from quantdrift.detectors.noise_floor import NoiseFloor, NoiseFloorState, metric_values
from quantdrift.schemas.score import ScoreEvent


@dataclass(frozen=True, slots=True)
class Folded:
    """What one score changed: the route state, or the noise floor, and a transition;
    ``change`` when the score came from a new candidate (its evidence restarted);
    ``notices`` the tests it found abstaining for want of a floor for the first time,
    ``not_armed`` the relied-on tests still abstaining when it crossed the policy's
    ``unarmed_alert_pairs`` (``breaker/readiness.py``)."""

    route_state: RouteState | None = None
    floor: NoiseFloorState | None = None
    transition: Transition | None = None
    change: CandidateChange | None = None
    notices: tuple[str, ...] = ()
    not_armed: tuple[str, ...] = ()


def fold(
    policy: RoutePolicy,
    route_state: RouteState,
    floor: NoiseFloorState,
    score: ScoreEvent,
    now: float,
    noise_floor: NoiseFloor,
) -> Folded:
    """Noise pairs feed the floor of their decoding mode; shadow pairs feed the judge.

    A noise pair whose two runs came out token for token the same (two greedy runs
    of a deterministic server) says nothing about how much disagreement is normal:
    it is left out, as ``quantdrift calibrate`` leaves it out, so that live echoes do
    not drag a floor towards zero.
    """
    if score.kind == "noise":
        if is_echo(score):
            return Folded(floor=floor)
        return Folded(floor=noise_floor.update(floor, metric_values(score.metrics)))
    decision: Decision = judge(policy, route_state, score, now, floor, noise_floor)
    state, seen = observe_readiness(policy, decision.state, score, floor)
    return Folded(
        route_state=sureness(policy, state),
        transition=decision.transition,
        notices=seen.notices,
        not_armed=seen.not_armed,
    )


@dataclass(frozen=True, slots=True)
class FoldedMany:
    """What a prefix of one route's scores changed.

    ``outcomes[i]`` is None for a duplicate (seen before, or earlier in the batch),
    else what ``scores[i]`` changed; there are ``consumed`` of them. ``state`` is the
    route's state after the prefix (None: no shadow pair folded), ``floors`` the
    floors it changed by decoding mode, ``marked`` the indices folded for the first
    time. A prefix ends after its first transition, candidate change or "not armed"
    alert (``not_armed``), so one commit carries at most one command and one alert of
    each; the caller folds the rest onto the new state.
    """

    consumed: int
    outcomes: tuple[Folded | None, ...]
    state: RouteState | None = None
    floors: dict[str, NoiseFloorState] = field(default_factory=dict)
    marked: tuple[int, ...] = ()
    transition: Transition | None = None
    change: CandidateChange | None = None
    not_armed: tuple[str, ...] = ()


def fold_many(
    policy: RoutePolicy,
    state: RouteState,
    floors: Mapping[str, NoiseFloorState],
    seen: Sequence[bool],
    scores: Sequence[ScoreEvent],
    now: float,
    noise_floor: NoiseFloor,
) -> FoldedMany:
    """Tick the route at ``now``, then fold ``scores`` (one route's, in order) up to and
    including the first transition or candidate change.

    A tick that transitions is a prefix of its own: ``consumed`` is 0, ``state`` the
    half-open state and ``transition`` the tick's, and the caller folds the scores
    onto it next, so one commit still carries at most one command.

    ``seen[i]`` says whether the store already folded ``scores[i]``; a pair that
    comes twice in the batch folds once. ``floors`` holds the route's floor for every
    decoding mode in the batch (a missing one starts empty). A shadow score from a
    new candidate (``breaker/candidate.py``) folds onto a restarted state, and the
    change is reported once: the store marks its pair seen in the same commit that
    writes the restarted state, so a redelivery finds it seen and reports nothing.
    """
    ticked = tick(policy, state, now)
    if ticked.transition is not None:
        return FoldedMany(0, (), ticked.state, transition=ticked.transition)
    outcomes: list[Folded | None] = []
    new_floors: dict[str, NoiseFloorState] = {}
    new_state: RouteState | None = None
    marked: list[int] = []
    idents: set[tuple[str, str]] = set()
    for i, (score, seen_before) in enumerate(zip(scores, seen, strict=True)):
        ident = (score.kind, score.pair_id)
        if seen_before or ident in idents:
            outcomes.append(None)
            continue
        idents.add(ident)
        marked.append(i)
        mode = floor_key_suffix(score)
        if mode in new_floors:
            floor = new_floors[mode]
        else:
            floor = floors[mode] if mode in floors else noise_floor.init()
        base, change = new_state or state, None
        if score.kind != "noise":
            base, change = observe(base, score, now)
        folded = fold(policy, base, floor, score, now, noise_floor)
        if change is not None:
            folded = replace(folded, change=change)
        outcomes.append(folded)
        if folded.floor is not None:
            new_floors[mode] = folded.floor
            continue
        new_state = folded.route_state
        if folded.transition is not None or change is not None or folded.not_armed:
            break
    last = outcomes[-1] if outcomes else None
    return FoldedMany(
        consumed=len(outcomes),
        outcomes=tuple(outcomes),
        state=new_state,
        floors=new_floors,
        marked=tuple(marked),
        transition=last.transition if last is not None else None,
        change=last.change if last is not None else None,
        not_armed=last.not_armed if last is not None else (),
    )


def is_echo(score: ScoreEvent) -> bool:
    """Both sides tokenized the same (no divergence, same length): an echo, not noise.

    The one test of it: the live fold leaves echoes out of a floor, and so does
    ``quantdrift calibrate`` (``evaluation/calibration.py`` imports it).
    """
    m = score.metrics
    return (
        m.first_divergence is None
        and m.candidate_tokens is not None
        and m.candidate_tokens == m.reference_tokens
    )


def last_pair_id(scores: Sequence[ScoreEvent], step: FoldedMany) -> str:
    """The pair id of a prefix's last score: the one whose fold made its alert."""
    return scores[step.consumed - 1].pair_id


# Every decoding mode a floor is kept for (``floor_key_suffix``).
DECODING_MODES = ("greedy", "sampled")


def floor_key_suffix(score: ScoreEvent) -> str:
    """Greedy and sampled decoding disagree very differently: one floor each."""
    return score.decoding
