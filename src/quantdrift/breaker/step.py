"""The one fold both stores share: a score in, new states and maybe a transition out."""

from __future__ import annotations

from dataclasses import dataclass

from quantdrift.breaker.machine import Decision, judge
from quantdrift.breaker.policy import RoutePolicy
from quantdrift.breaker.state import RouteState, Transition
from quantdrift.detectors.noise_floor import NoiseFloor, NoiseFloorState, metric_values
from quantdrift.schemas.score import ScoreEvent


@dataclass(frozen=True, slots=True)
class Folded:
    """What one score changed: the route state, or the noise floor, and a transition."""

    route_state: RouteState | None = None
    floor: NoiseFloorState | None = None
    transition: Transition | None = None


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
        if _echo(score):
            return Folded(floor=floor)
        return Folded(floor=noise_floor.update(floor, metric_values(score.metrics)))
    decision: Decision = judge(policy, route_state, score, now, floor, noise_floor)
    return Folded(route_state=decision.state, transition=decision.transition)


def _echo(score: ScoreEvent) -> bool:
    m = score.metrics
    return (
        m.first_divergence is None
        and m.candidate_tokens is not None
        and m.candidate_tokens == m.reference_tokens
    )


def floor_key_suffix(score: ScoreEvent) -> str:
    """Greedy and sampled decoding disagree very differently: one floor each."""
    return score.decoding
