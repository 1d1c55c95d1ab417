"""Score every pair once; several policies reuse the metrics.

Metrics do not depend on the policy, the per-pair verdict does (its
similarity threshold and entropy floor come from the route's policy), and it
is cheap: so the cache holds metrics (the scorer's half of
``embedding.batch.score_batch``), and :func:`to_score` builds the ScoreEvent a
worker would have produced under a given policy (its other half, ``score_events``).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import orjson

from quantdrift.breaker.policy import RoutePolicy, failure_thresholds
from quantdrift.detectors import Embedder
from quantdrift.embedding.batch import score_events
from quantdrift.embedding.factory import score_with
from quantdrift.schemas import Metrics, PairEvent, ScoreEvent


def to_score(
    pair: PairEvent, metrics: Metrics, policy: RoutePolicy, route: str | None = None
) -> ScoreEvent:
    """The ScoreEvent of ``pair`` under ``policy``, optionally on another route."""
    thresholds = failure_thresholds(policy)
    (score,) = score_events([pair], [metrics], lambda _route: thresholds, route)
    return score


# What a pair's metrics depend on: everything but its identity, time and labels.
_NOT_CONTENT = {"pair_id", "ts", "route", "label", "sample_rate", "schema_version"}


def content_key(pair: PairEvent) -> str:
    """A digest of what the metrics depend on: two pairs with the same outputs and
    request share their metrics, whatever their id, route or timestamp."""
    body = orjson.dumps(pair.model_dump(exclude=_NOT_CONTENT), option=orjson.OPT_SORT_KEYS)
    return hashlib.blake2b(body, digest_size=16).hexdigest()


@dataclass
class ScoreCache:
    """Metrics by content (:func:`content_key`), filled in batches of ``batch_size``.

    Resampled long streams and the same pair under another id or route cost no
    extra scoring: only distinct contents reach the scorer.
    """

    embedder: Embedder | None
    batch_size: int = 64
    # Called as progress(total=N) when a fill starts and progress(advance=n) per batch:
    # scoring thousands of pairs takes minutes, and the command line shows a bar.
    progress: Callable[..., None] | None = None
    seconds: float = 0.0
    scored: int = 0
    _metrics: dict[str, Metrics] = field(default_factory=dict)
    _keys: dict[int, str] = field(default_factory=dict)
    _keep: list[PairEvent] = field(default_factory=list)

    def _key(self, pair: PairEvent) -> str:
        key = self._keys.get(id(pair))
        if key is None:
            key = self._keys[id(pair)] = content_key(pair)
            self._keep.append(pair)  # ids stay valid while the pairs are alive
        return key

    def fill(self, pairs: Sequence[PairEvent]) -> None:
        """Score the contents not scored yet, ``batch_size`` at a time (one embed call each)."""
        todo: dict[str, PairEvent] = {}
        for p in pairs:
            key = self._key(p)
            if key not in self._metrics:
                todo.setdefault(key, p)
        items = list(todo.items())
        t0 = time.perf_counter()
        if self.progress is not None and items:
            self.progress(total=len(items))
        for start in range(0, len(items), self.batch_size):
            batch = items[start : start + self.batch_size]
            scored = score_with(self.embedder, [p for _, p in batch])
            for (key, _), m in zip(batch, scored, strict=True):
                self._metrics[key] = m
            if self.progress is not None:
                self.progress(advance=len(batch))
        self.seconds += time.perf_counter() - t0
        self.scored += len(items)

    def __getitem__(self, pair: PairEvent) -> Metrics:
        return self._metrics[self._key(pair)]

    @property
    def pairs_per_s(self) -> float | None:
        return self.scored / self.seconds if self.seconds > 0 else None
