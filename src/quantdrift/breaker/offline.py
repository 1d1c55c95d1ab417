"""Folding a recorded stream through a store, each score at its own time.

Replay, eval and calibrate judge recorded scores, not live ones: they reach the
decision through the :class:`~quantdrift.breaker.protocol.BreakerStore` protocol,
on the in-memory store (:func:`offline_store`), so they decide as the worker
does. :class:`StreamFold` is the one driver they share, and what it adds to the
store is only what a recording lacks:

* a clock: live, the worker's 0.5 s timer ticks cool-downs; a recording has no
  timer, so time moves with the scores: each score folds at its own time, and
  the store's fold ticks the route at that time first (a transition the tick
  makes is a trip like any other);
* trips: the store answers with outboxes, and a report wants a trip (route, the
  route's shadow pairs so far, the pair, the transition, the epoch).
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable
from dataclasses import dataclass, field

from quantdrift.breaker.memory_store import MemoryBreakerStore
from quantdrift.breaker.outbox import Outbox
from quantdrift.breaker.policy import Policy, RoutePolicy
from quantdrift.breaker.protocol import BreakerStore
from quantdrift.breaker.state import RouteState, Transition
from quantdrift.detectors.noise_floor import NoiseFloor
from quantdrift.schemas.score import ScoreEvent
from quantdrift.schemas.signing import CommandSigner


@dataclass(frozen=True, slots=True)
class Trip:
    """A transition as replay reports it: ``index`` counts the route's shadow pairs
    folded so far (a tick's trip, before the score, counts the ones before it)."""

    route: str
    index: int
    pair_id: str
    transition: Transition
    epoch: int


def offline_store(noise_floor: NoiseFloor | None = None) -> MemoryBreakerStore:
    """A memory store for a recording: its commands never leave the process, so they
    are signed with a key made for it and dropped with it."""
    signer = CommandSigner("offline", secrets.token_bytes(32))
    return MemoryBreakerStore(signer, noise_floor=noise_floor or NoiseFloor())


@dataclass
class StreamFold:
    """Scores folded in order through ``store`` under ``policy``; the trips they made."""

    store: BreakerStore
    policy: Policy
    shadow_pairs: dict[str, int] = field(default_factory=dict)
    _policies: dict[str, RoutePolicy] = field(default_factory=dict)

    def route_policy(self, route: str) -> RoutePolicy:
        """The route's policy, merged once (a route override is validated per call)."""
        policy = self._policies.get(route)
        if policy is None:
            policy = self._policies[route] = self.policy.for_route(route)
        return policy

    async def fold(self, score: ScoreEvent, now: float) -> list[Trip]:
        """Fold the score at ``now``: the trips it made, a cool-down's first.

        The store's fold ticks the route at ``now`` before the score (``fold_many``
        ticks first), whether or not the score turns out to be a redelivery, as the
        live timer ticks whatever arrives; that tick's transition comes back as the
        answer's ``ticked`` and is a trip of its own, counted before the score.
        """
        route, policy = score.route, self.route_policy(score.route)
        result = await self.store.fold(score, policy, now)
        trips = self._trips(score, result.ticked)
        if result.status == "ok" and result.state is not None:  # a shadow pair, folded
            self.shadow_pairs[route] = self.shadow_pairs.get(route, 0) + 1
        return trips + self._trips(score, result.outbox)

    async def fold_all(self, timed: Iterable[tuple[float, ScoreEvent]]) -> list[Trip]:
        """Every score at its time, in order: all the trips."""
        trips: list[Trip] = []
        for now, score in timed:
            trips += await self.fold(score, now)
        return trips

    async def state(self, route: str) -> RouteState:
        """The route's state now (a route not seen yet is closed)."""
        state, _ = await self.store.read(route)
        return state

    def _trips(self, score: ScoreEvent, outbox: Outbox | None) -> list[Trip]:
        if outbox is None:
            return []
        index = self.shadow_pairs.get(score.route, 0)
        return [Trip(score.route, index, score.pair_id, outbox.transition, outbox.command.epoch)]
