"""Tiered semantic scoring: the static cosine on every pair, MiniLM where it can matter.

A pair's cosine only changes a decision when it can land on the other side of
a threshold. So every pair gets the static tier's cosine, mapped onto MiniLM's
scale by the :class:`~quantdrift.embedding.static.Calibration`, and a
pair *escalates* to the full transformer when

1. ``band``: its mapped static cosine lies within the calibration's band of a
   similarity threshold (the estimate is not sure which side it is on);
2. ``suspicious``: its route is suspicious — named by the caller, or one of
   this batch's routes that failed (any verdict but ``ok``) within its last
   ``watch_pairs`` pairs; there the consecutive-failure rule is counting, and
   every cosine of it should be the exact one;
3. ``sample``: its ``pair_id`` hashes into the ``sample_rate`` fraction (a
   deterministic ~1 % that keeps measuring how well the tiers agree; both
   cosines are recorded in :class:`Agreement`).

The full model has a budget (``max_rate`` of the pairs, a token bucket across
batches): MiniLM costs ~100-200 ms a 200-token pair on one core, so every 1 %
escalated costs ~1-2 ms a pair on average. When more pairs qualify than the
budget allows, the sample goes first, then the pairs closest to a threshold
(a suspicious route's counting half as far); the rest keep the static cosine
and are counted in ``Agreement.over_budget``. All escalated pairs of a batch,
across routes, go to the full embedder in ONE ``embed`` call (its cache makes a
reference seen before free).
``Metrics.cosine_tier`` says which tier produced each cosine.
"""

from __future__ import annotations

import hashlib
import threading
from collections import deque
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from quantdrift.detectors.semantic import Embedder, FloatArray, cosine_pairs
from quantdrift.detectors.suite import FailureThresholds, score_pairs, verdict
from quantdrift.embedding.static import Calibration
from quantdrift.schemas.pair import PairEvent
from quantdrift.schemas.score import Metrics

Reason = Literal["band", "suspicious", "sample"]


@dataclass(frozen=True, slots=True)
class Escalation:
    """When a pair goes to the full model. ``band`` None: the calibration's band."""

    thresholds: tuple[float, ...] = (0.88,)
    band: float | None = None
    sample_rate: float = 0.01
    watch_pairs: int = 3
    # The full model's budget, as a fraction of pairs (a token bucket across
    # batches, burst ``burst`` pairs): when more pairs qualify, the closest to a
    # threshold go first and the rest keep their static cosine. None: no cap.
    max_rate: float | None = 0.015
    burst: int = 8

    def __post_init__(self) -> None:
        if not 0.0 <= self.sample_rate <= 1.0:
            raise ValueError(f"sample_rate must be in [0, 1], got {self.sample_rate}")
        if self.band is not None and self.band < 0:
            raise ValueError(f"band must be >= 0, got {self.band}")
        if self.watch_pairs < 0:
            raise ValueError(f"watch_pairs must be >= 0, got {self.watch_pairs}")
        if self.max_rate is not None and not 0.0 <= self.max_rate <= 1.0:
            raise ValueError(f"max_rate must be in [0, 1], got {self.max_rate}")
        if self.burst < 1:
            raise ValueError(f"burst must be >= 1, got {self.burst}")


def sampled(pair_id: str, rate: float) -> bool:
    """Whether ``pair_id`` is in the agreement sample: stable across processes and runs.

    Examples
    --------
    >>> sampled("p-1", 0.0), sampled("p-1", 1.0)
    (False, True)
    >>> sum(sampled(f"p-{i}", 0.02) for i in range(10_000))  # ~2 %
    197
    """
    if rate <= 0.0:
        return False
    digest = hashlib.blake2b(pair_id.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "big") < rate * 2**64


def escalation_reason(
    mapped_static: float,
    route: str,
    pair_id: str,
    suspicious: Collection[str],
    thresholds: Sequence[float],
    band: float,
    sample_rate: float,
) -> Reason | None:
    """Why a pair escalates (the first reason that holds), or None. Pure.

    Examples
    --------
    >>> escalation_reason(0.90, "r", "p", (), (0.88,), 0.05, 0.0)
    'band'
    >>> escalation_reason(0.97, "r", "p", {"r"}, (0.88,), 0.05, 0.0)
    'suspicious'
    >>> escalation_reason(0.97, "r", "p", (), (0.88,), 0.05, 0.0) is None
    True
    """
    # The sample first: it must cover every cosine range to measure agreement fairly.
    if sampled(pair_id, sample_rate):
        return "sample"
    if any(abs(mapped_static - t) <= band for t in thresholds):
        return "band"
    if route in suspicious:
        return "suspicious"
    return None


@dataclass(frozen=True, slots=True)
class PairCosine:
    """One pair's cosine and how it was produced."""

    cosine: float | None
    tier: str | None
    static: float | None = None  # mapped onto MiniLM's scale
    minilm: float | None = None
    reason: Reason | None = None


@dataclass
class Agreement:
    """Running agreement between tiers, fed by every escalated pair (both cosines known)."""

    pairs: int = 0
    escalated: dict[str, int] = field(
        default_factory=lambda: {"band": 0, "suspicious": 0, "sample": 0}
    )
    # (mapped static, minilm) of the random sample only: an unbiased view of the error.
    recent: deque[tuple[float, float]] = field(default_factory=lambda: deque(maxlen=2048))
    sample_abs_error_sum: float = 0.0
    sample_decision_flips: int = 0
    # Pairs that qualified but found the budget spent (they kept the static cosine).
    over_budget: int = 0

    def summary(self) -> dict[str, float | int | None]:
        n = self.escalated["sample"]
        return {
            "pairs": self.pairs,
            "escalated": sum(self.escalated.values()),
            **{f"escalated_{k}": v for k, v in self.escalated.items()},
            "escalation_rate": (sum(self.escalated.values()) / self.pairs) if self.pairs else None,
            "sample_mean_abs_error": (self.sample_abs_error_sum / n) if n else None,
            "sample_decision_flips": self.sample_decision_flips,
            "over_budget": self.over_budget,
        }


class RouteWatch:
    """Routes with a recent failure: suspicious for the next ``pairs`` pairs they send."""

    def __init__(self, pairs: int = 50) -> None:
        self.pairs = pairs
        self._left: dict[str, int] = {}

    def observe(self, route: str, failed: bool) -> None:
        if failed and self.pairs > 0:
            self._left[route] = self.pairs
        elif route in self._left:
            self._left[route] -= 1
            if self._left[route] <= 0:
                del self._left[route]

    def suspicious(self) -> frozenset[str]:
        return frozenset(self._left)


class TieredScorer:
    """Static cosine on every pair; the full embedder on the pairs that can change a decision.

    ``full=None`` is the static-only tier (nothing escalates). As an
    :class:`Embedder` (``embed``) it is the full model, or the static one when
    there is no full model, so code that wants plain embeddings still works.
    """

    def __init__(
        self,
        static: Embedder,
        full: Embedder | None,
        calibration: Calibration,
        escalation: Escalation = Escalation(),
        failure_thresholds: FailureThresholds | None = None,
    ) -> None:
        self.static = static
        self.full = full
        self.calibration = calibration
        self.escalation = escalation
        self.band = calibration.band if escalation.band is None else escalation.band
        self.failure_thresholds = failure_thresholds or FailureThresholds(
            similarity=escalation.thresholds[0]
        )
        self.watch = RouteWatch(escalation.watch_pairs)
        self.agreement = Agreement()
        self.full_calls = 0
        self._credit = float(escalation.burst)
        self._lock = threading.Lock()

    @property
    def tier(self) -> str:
        """The tier of :meth:`embed` (used when this is passed as a plain Embedder)."""
        return "minilm" if self.full is not None else "static"

    def embed(self, texts: Sequence[str]) -> FloatArray:
        return np.asarray((self.full or self.static).embed(texts), dtype=np.float32)

    def cosines(
        self, pairs: Sequence[PairEvent], suspicious: Collection[str] = frozenset()
    ) -> list[PairCosine]:
        """Each pair's cosine (static or full), in order; at most one full ``embed`` call."""
        if not pairs:
            return []
        cands = [p.candidate.text for p in pairs]
        refs = [p.reference.text for p in pairs]
        raw = cosine_pairs(self.static, cands, refs)
        mapped = self.calibration.apply(raw)
        # Identical texts are identical under every model: no estimate, no escalation.
        same = np.fromiter((c == r for c, r in zip(cands, refs, strict=True)), bool, len(pairs))
        mapped[same] = 1.0
        if self.full is None:
            return [PairCosine(float(s), "static", float(s)) for s in mapped]
        with self._lock:
            watched = self.watch.suspicious()
        hot = watched | frozenset(suspicious)
        reasons: list[Reason | None] = [
            None
            if same[i]
            else escalation_reason(
                float(mapped[i]),
                p.route,
                p.pair_id,
                hot,
                self.escalation.thresholds,
                self.band,
                self.escalation.sample_rate,
            )
            for i, p in enumerate(pairs)
        ]
        up = self._within_budget(reasons, mapped, hot, pairs)
        chosen = set(up)
        skipped = sum(r is not None for r in reasons) - len(up)
        reasons = [r if i in chosen else None for i, r in enumerate(reasons)]
        exact: dict[int, float] = {}
        if up:
            values = cosine_pairs(self.full, [cands[i] for i in up], [refs[i] for i in up])
            exact = {i: float(v) for i, v in zip(up, values, strict=True)}
        out: list[PairCosine] = []
        with self._lock:
            self.agreement.pairs += len(pairs)
            self.agreement.over_budget += skipped
            self.full_calls += bool(up)
            for i, reason in enumerate(reasons):
                s = float(mapped[i])
                if reason is None:
                    out.append(PairCosine(s, "static", s))
                    continue
                m = exact[i]
                self.agreement.escalated[reason] += 1
                if reason == "sample":
                    self.agreement.recent.append((s, m))
                    self.agreement.sample_abs_error_sum += abs(s - m)
                    t = self.escalation.thresholds
                    self.agreement.sample_decision_flips += any((s < x) != (m < x) for x in t)
                out.append(PairCosine(m, "minilm", s, m, reason))
        return out

    def _within_budget(
        self,
        reasons: Sequence[Reason | None],
        mapped: FloatArray,
        hot: frozenset[str],
        pairs: Sequence[PairEvent],
    ) -> list[int]:
        """Indices to escalate: all of them without a cap, else the most decisive first.

        Order: the agreement sample (few, and it must stay a fair sample), then
        by distance to the nearest threshold in band units, a suspicious route's
        pairs counting half as far.
        """
        wanted = [i for i, r in enumerate(reasons) if r is not None]
        cap = self.escalation.max_rate
        if cap is None:
            return wanted
        thresholds = self.escalation.thresholds
        band = max(self.band, 1e-6)

        def key(i: int) -> tuple[int, float]:
            dist = min(abs(float(mapped[i]) - t) for t in thresholds) / band
            if pairs[i].route in hot:
                dist /= 2
            return (0 if reasons[i] == "sample" else 1, dist)

        with self._lock:
            self._credit = min(float(self.escalation.burst), self._credit + cap * len(pairs))
            take = min(len(wanted), int(self._credit))
            self._credit -= take
        return sorted(sorted(wanted, key=key)[:take])

    def score_pairs(
        self, pairs: Sequence[PairEvent], suspicious: Collection[str] = frozenset()
    ) -> list[Metrics]:
        """The full metric suite with tiered cosines; failures feed the route watch."""
        found = self.cosines(pairs, suspicious)
        metrics = score_pairs(pairs, None, cosines=[(c.cosine, c.tier) for c in found])
        with self._lock:
            for p, m in zip(pairs, metrics, strict=True):
                self.watch.observe(p.route, verdict(m, self.failure_thresholds)[0] != "ok")
        return metrics
