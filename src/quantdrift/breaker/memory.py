"""An in-memory breaker for replay and evaluation: the same fold, no side effects."""

from __future__ import annotations

from dataclasses import dataclass, field

from quantdrift.breaker.policy import Policy
from quantdrift.breaker.state import RouteState, Transition
from quantdrift.breaker.step import floor_key_suffix, fold_many
from quantdrift.detectors.noise_floor import NoiseFloor, NoiseFloorState, metric_values
from quantdrift.schemas.score import ScoreEvent


@dataclass(frozen=True, slots=True)
class Trip:
    """A transition as replay reports it: when, on which pair, by which rule."""

    route: str
    index: int
    pair_id: str
    transition: Transition
    epoch: int


@dataclass
class MemoryBreaker:
    """Routes' states in dicts; ``fold`` returns the transition, never publishes it."""

    policy: Policy
    noise_floor: NoiseFloor = field(default_factory=NoiseFloor)
    states: dict[str, RouteState] = field(default_factory=dict)
    floors: dict[tuple[str, str], NoiseFloorState] = field(default_factory=dict)
    seen: set[tuple[str, str, str]] = field(default_factory=set)
    trips: list[Trip] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)

    def seed_floor(self, score: ScoreEvent) -> None:
        """Calibrate from an offline noise pair (``quantdrift calibrate``)."""
        key = (score.route, floor_key_suffix(score))
        floor = self.floors.get(key, self.noise_floor.init())
        self.floors[key] = self.noise_floor.update(floor, metric_values(score.metrics))

    def fold(self, score: ScoreEvent, now: float) -> Transition | None:
        """Fold one score at ``now`` (its time: replay has no clock), as the stores do.

        ``fold_many`` ticks the route first; a tick that half-opens it is a prefix of
        its own, recorded on this score and stored, and the score folds onto it.
        """
        ident = (score.route, score.kind, score.pair_id)
        if ident in self.seen:
            return None
        self.seen.add(ident)
        route_policy = self.policy.for_route(score.route)
        key = (score.route, floor_key_suffix(score))
        while True:
            state = self.states.get(score.route, RouteState())
            floor = self.floors.get(key, self.noise_floor.init())
            step = fold_many(
                route_policy, state, {key[1]: floor}, [False], [score], now, self.noise_floor
            )
            if step.consumed:
                break
            assert step.state is not None and step.transition is not None
            self.states[score.route] = step.state
            self._record(score, step.transition, step.state)
        folded = step.outcomes[0]
        assert folded is not None
        if folded.floor is not None:
            self.floors[key] = folded.floor
            return None
        assert folded.route_state is not None
        self.states[score.route] = folded.route_state
        self.counts[score.route] = self.counts.get(score.route, 0) + 1
        if folded.transition is not None:
            self._record(score, folded.transition, folded.route_state)
        return folded.transition

    def _record(self, score: ScoreEvent, transition: Transition, state: RouteState) -> None:
        index = self.counts.get(score.route, 0)
        self.trips.append(Trip(score.route, index, score.pair_id, transition, state.epoch))
