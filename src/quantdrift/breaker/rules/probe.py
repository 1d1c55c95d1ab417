"""Half-open: the candidate runs in shadow behind the reference and must prove itself."""

from __future__ import annotations

from dataclasses import dataclass

from quantdrift.breaker.rules.reading import Fired, Pair


@dataclass(frozen=True, slots=True)
class ProbeState:
    passes: int = 0


@dataclass(frozen=True, slots=True)
class HalfOpenProbe:
    """One failing pair re-opens the route (the alarm); ``pairs`` passing ones prove
    the candidate (:meth:`proven`)."""

    pairs: int = 20

    def init(self) -> ProbeState:
        return ProbeState()

    def update(self, state: ProbeState, pair: Pair) -> tuple[ProbeState, Fired | None]:
        if pair.failing:
            reason = "half-open probe failed: " + ", ".join(pair.reasons or [pair.verdict])
            evidence = {"decisive_pair_id": pair.score.pair_id}
            return state, Fired("half_open_probe", reason, evidence)
        return ProbeState(state.passes + 1), None

    def proven(self, state: ProbeState) -> bool:
        return state.passes >= self.pairs
