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
    """Noise pairs feed the floor of their decoding mode; shadow pairs feed the judge."""
    if score.kind == "noise":
        return Folded(floor=noise_floor.update(floor, metric_values(score.metrics)))
    decision: Decision = judge(policy, route_state, score, now, floor, noise_floor)
    return Folded(route_state=decision.state, transition=decision.transition)


def floor_key_suffix(score: ScoreEvent) -> str:
    """Greedy and sampled decoding disagree very differently: one floor each."""
    return score.decoding
