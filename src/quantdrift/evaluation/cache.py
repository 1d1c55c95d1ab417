"""Score every pair once; several policies reuse the metrics.

Metrics do not depend on the policy, the per-pair verdict does (its
similarity threshold and entropy floor come from the route's policy), and it
is cheap: so the cache holds metrics, and :func:`to_score` builds the
ScoreEvent a worker would have produced under a given policy.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from quantdrift.breaker.policy import RoutePolicy, failure_thresholds
from quantdrift.detectors import Embedder, FailureThresholds
from quantdrift.detectors.embedders import score_with
from quantdrift.detectors.suite import score_event
from quantdrift.schemas import Metrics, PairEvent, ScoreEvent


def thresholds_for(policy: RoutePolicy) -> FailureThresholds:
    """The verdict's thresholds under a route policy (as the score agent builds them)."""
    return failure_thresholds(policy)


def to_score(
    pair: PairEvent, metrics: Metrics, policy: RoutePolicy, route: str | None = None
) -> ScoreEvent:
    """The ScoreEvent of ``pair`` under ``policy``, optionally on another route."""
    return score_event(pair, metrics, thresholds_for(policy), route)


@dataclass
class ScoreCache:
    """Metrics by object identity of the PairEvent, filled in batches of ``batch_size``."""

    embedder: Embedder | None
    batch_size: int = 64
    seconds: float = 0.0
    scored: int = 0
    _metrics: dict[int, Metrics] = field(default_factory=dict)
    _keep: list[PairEvent] = field(default_factory=list)

    def fill(self, pairs: Sequence[PairEvent]) -> None:
        """Score the pairs not scored yet, ``batch_size`` at a time (one embed call each)."""
        todo = list({id(p): p for p in pairs if id(p) not in self._metrics}.values())
        t0 = time.perf_counter()
        for start in range(0, len(todo), self.batch_size):
            batch = todo[start : start + self.batch_size]
            for pair, m in zip(batch, score_with(self.embedder, batch), strict=True):
                self._metrics[id(pair)] = m
        self._keep.extend(todo)  # ids stay valid while the pairs are alive
        self.seconds += time.perf_counter() - t0
        self.scored += len(todo)

    def __getitem__(self, pair: PairEvent) -> Metrics:
        return self._metrics[id(pair)]

    @property
    def pairs_per_s(self) -> float | None:
        return self.scored / self.seconds if self.seconds > 0 else None
