"""The seeds' rule: K failing shadow pairs in a row."""

from __future__ import annotations

from dataclasses import dataclass

from quantdrift.breaker.rules.reading import Fired, Pair


@dataclass(frozen=True, slots=True)
class ConsecutiveState:
    n: int = 0


@dataclass(frozen=True, slots=True)
class Consecutive:
    """Alarms while the last ``k`` pairs all failed; a passing pair starts over.

    The count keeps growing past ``k``: held back by ``min_pairs``, the alarm comes
    on the first pair the route may trip on.

    Examples
    --------
    >>> from quantdrift.breaker.policy import RoutePolicy
    >>> from quantdrift.breaker.rules.reading import read
    >>> from quantdrift.schemas import Metrics, ScoreEvent
    >>> def pair(ok):
    ...     s = ScoreEvent(pair_id="p", route="r", kind="shadow", ts=0, decoding="greedy",
    ...                    metrics=Metrics(cosine=0.99 if ok else 0.5))
    ...     return read(RoutePolicy(), s, None)
    >>> rule, state, alarms = Consecutive(k=2), ConsecutiveState(), []
    >>> for i, ok in enumerate([False, True, False, False, False]):
    ...     state, fired = rule.update(state, pair(ok))
    ...     if fired:
    ...         alarms.append(i)
    >>> alarms, state.n
    ([3, 4], 3)
    """

    k: int = 3

    def init(self) -> ConsecutiveState:
        return ConsecutiveState()

    def update(self, state: ConsecutiveState, pair: Pair) -> tuple[ConsecutiveState, Fired | None]:
        n = state.n + 1 if pair.failing else 0
        if n < self.k:
            return ConsecutiveState(n), None
        return ConsecutiveState(n), Fired(
            "consecutive",
            f"{n} consecutive failing pairs (K={self.k})",
            {"consecutive": n, "last_reasons": list(pair.reasons)},
        )
