"""Tiered semantic scoring: the static cosine on every pair, MiniLM where it can matter.

A pair's cosine only changes a decision when it can land on the other side of
a threshold. So every pair gets the static tier's cosine, mapped onto MiniLM's
scale by the :class:`~quantdrift.embedding.static.Calibration`, and a pair
*escalates* to the full transformer by one rule, :func:`escalation_reason`,
whose inputs are the pair's two texts, its mapped static cosine and the
:class:`Escalation` settings:

1. ``sample``: the pair's texts draw into the ``sample_rate`` fraction (a
   deterministic 0.25 % over every cosine range, that keeps measuring how well
   the tiers agree; both cosines are recorded in :class:`Agreement`, and the
   worker's /metrics exports it);
2. ``band``: its mapped static cosine lies within the calibration's band of a
   similarity threshold, at ``d`` band widths from the nearest one
   (``0 <= d <= 1``), and its texts' second draw ``u`` in [0, 1) has
   ``u * d < rate``. A pair on the bar always escalates, one at ``d`` does with
   probability ``min(1, rate / d)``: the closer, the likelier, and far fewer than
   the whole band. ``rate`` None escalates every pair in the band, 0 none.

Identical texts never escalate: they are identical under every model.

**The score is a function of the pair.** Both draws are a keyed hash of the
candidate's and the reference's text, the static cosine is a function of the
same texts (each text is embedded on its own: bit for bit the same in any batch
and order), and the settings come from the one factory every worker, replay and
eval build their scorer with. Nothing else enters: not the batch a pair
arrived in, not what the worker scored before, not the time. So two workers
that score the same pair (a redelivery after one died, a replay of the topic)
escalate it alike and publish the same cosine, tier and verdict; and two pairs
with the same outputs get the same metrics whatever their ids, which is what
the evaluation's content cache assumes.

**Cost without a budget.** MiniLM costs ~100-200 ms a 200-token pair on one
core, so every 1 % escalated costs ~1-2 ms a pair on average. A worker-local
budget would bound that but make the tier depend on the worker's history, so the
bound is in the rule instead: over the band's pairs the share escalated is the
mean of ``min(1, rate / d)``. Spread evenly across the band that is
``rate * (1 + ln(1 / rate))`` of them (3.1 % at the default 0.005), plus the
sample; only a stream packed within ``rate`` band widths of a threshold
(±0.0009 around 0.88 with the shipped band) costs more, and there every cosine
is a coin flip on the bar that only the full model can settle. Band pairs the
draw passed over are counted in ``Agreement.passed_over``. All escalated pairs
of a batch, across routes, go to the full embedder in ONE ``embed`` call (its
cache makes a reference seen before free).

``Metrics.cosine_tier`` says which tier produced each cosine.

Examples
--------
>>> esc = Escalation(thresholds=(0.88,), sample_rate=0.0, rate=0.005)
>>> escalation_reason(0.88, "a cat", "the cat", esc, band=0.1)  # on the bar
'band'
>>> escalation_reason(0.99, "a cat", "the cat", esc, band=0.1) is None  # clear of it
True
>>> escalation_reason(0.88, "the cat", "the cat", esc, band=0.1) is None  # same text
True
"""

from __future__ import annotations

import hashlib
import threading
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from quantdrift.detectors.semantic import Embedder, FloatArray, cosine_pairs
from quantdrift.detectors.suite import score_pairs
from quantdrift.embedding.static import Calibration
from quantdrift.schemas.pair import PairEvent
from quantdrift.schemas.score import Metrics

Reason = Literal["band", "sample"]


@dataclass(frozen=True, slots=True)
class Escalation:
    """When a pair goes to the full model. ``band`` None: the calibration's band.

    ``rate``: a pair ``d`` band widths from a threshold escalates with probability
    ``min(1, rate / d)``, drawn from its texts (None: every pair in the band; 0: none).
    """

    thresholds: tuple[float, ...] = (0.88,)
    band: float | None = None
    # One pair in 400: about 900 an hour at 100 pairs/s, enough to see the tiers
    # drift apart within the hour. At 1 % the sample was more than half of all
    # escalations (14 of 25 in bench/scoring.py), each ~100-200 ms of MiniLM.
    sample_rate: float = 0.0025
    rate: float | None = 0.005

    def __post_init__(self) -> None:
        if not self.thresholds:
            raise ValueError("thresholds must name at least one similarity threshold")
        if not 0.0 <= self.sample_rate <= 1.0:
            raise ValueError(f"sample_rate must be in [0, 1], got {self.sample_rate}")
        if self.band is not None and self.band < 0:
            raise ValueError(f"band must be >= 0, got {self.band}")
        if self.rate is not None and not 0.0 <= self.rate <= 1.0:
            raise ValueError(f"rate must be in [0, 1], got {self.rate}")


def draw(candidate: str, reference: str, purpose: str) -> float:
    """A uniform number in [0, 1) fixed by the two texts: the same in every process and run.

    ``purpose`` keys the hash, so the sample's and the band's draws are independent.

    Examples
    --------
    >>> draw("a", "b", "sample") == draw("a", "b", "sample")
    True
    >>> draw("a", "b", "sample") != draw("a", "b", "band") != draw("ab", "", "band")
    True
    >>> sum(draw(f"c{i}", f"r{i}", "sample") < 0.02 for i in range(10_000))  # ~2 %
    208
    """
    h = hashlib.blake2b(digest_size=8, person=purpose.encode()[:16])
    for text in (candidate, reference):
        raw = text.encode("utf-8", "surrogatepass")
        h.update(len(raw).to_bytes(8, "big"))  # length-prefixed: ("ab", "") != ("a", "b")
        h.update(raw)
    return int.from_bytes(h.digest(), "big") / 2**64


def band_distance(mapped_static: float, thresholds: Sequence[float], band: float) -> float:
    """Distance to the nearest threshold in band widths (inf when the band is empty)."""
    gap = min(abs(mapped_static - t) for t in thresholds)
    if band <= 0:
        return 0.0 if gap == 0 else float("inf")
    return gap / band


def escalation_reason(
    mapped_static: float,
    candidate: str,
    reference: str,
    escalation: Escalation,
    band: float,
) -> Reason | None:
    """Why a pair escalates (the first reason that holds), or None.

    Pure: the texts, their mapped static cosine and the settings decide, nothing else.
    """
    if candidate == reference:
        return None
    # The sample first: it must cover every cosine range to measure agreement fairly.
    if draw(candidate, reference, "sample") < escalation.sample_rate:
        return "sample"
    d = band_distance(mapped_static, escalation.thresholds, band)
    if d > 1.0:
        return None
    if escalation.rate is None or draw(candidate, reference, "band") * d < escalation.rate:
        return "band"
    return None


@dataclass(frozen=True, slots=True)
class PairCosine:
    """One pair's cosine and how it was produced."""

    cosine: float | None
    tier: str | None
    static: float | None = None  # mapped onto MiniLM's scale
    minilm: float | None = None
    reason: Reason | None = None


@dataclass(frozen=True, slots=True)
class StaticPass:
    """A batch after the static tier: each pair's mapped cosine and why it escalates."""

    pairs: tuple[PairEvent, ...]
    mapped: tuple[float, ...]
    reasons: tuple[Reason | None, ...]

    @property
    def escalated(self) -> list[int]:
        """Indices of the pairs the full model must settle, in batch order."""
        return [i for i, r in enumerate(self.reasons) if r is not None]


@dataclass(frozen=True, slots=True)
class Staged:
    """A batch scored as far as the cheap tier goes.

    ``ready``: the final metrics of every pair that does not escalate, by index in
    ``pairs``; the others (``waiting``) get theirs from :meth:`TieredScorer.finish`.
    A scorer without tiers stages a batch with every pair ready.
    """

    pairs: tuple[PairEvent, ...]
    ready: dict[int, Metrics]
    plan: StaticPass | None = None

    @property
    def waiting(self) -> list[int]:
        """Indices of the pairs whose metrics wait for the full model, in batch order."""
        return [i for i in range(len(self.pairs)) if i not in self.ready]


@dataclass
class Agreement:
    """Running agreement between tiers, fed by every escalated pair (both cosines known).

    Observation only: nothing here feeds back into which pairs escalate.
    """

    pairs: int = 0
    escalated: dict[str, int] = field(default_factory=lambda: {"band": 0, "sample": 0})
    # (mapped static, minilm) of the random sample only: an unbiased view of the error.
    recent: deque[tuple[float, float]] = field(default_factory=lambda: deque(maxlen=2048))
    sample_abs_error_sum: float = 0.0
    sample_decision_flips: int = 0
    # Pairs in the band whose draw kept them on the static cosine.
    passed_over: int = 0

    def summary(self) -> dict[str, float | int | None]:
        n = self.escalated["sample"]
        return {
            "pairs": self.pairs,
            "escalated": sum(self.escalated.values()),
            **{f"escalated_{k}": v for k, v in self.escalated.items()},
            "escalation_rate": (sum(self.escalated.values()) / self.pairs) if self.pairs else None,
            "sample_mean_abs_error": (self.sample_abs_error_sum / n) if n else None,
            "sample_decision_flips": self.sample_decision_flips,
            "passed_over": self.passed_over,
        }


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
    ) -> None:
        self.static = static
        self.full = full
        self.calibration = calibration
        self.escalation = escalation
        self.band = calibration.band if escalation.band is None else escalation.band
        self.agreement = Agreement()
        self.full_calls = 0
        self._lock = threading.Lock()  # the counters only; scores take no shared state

    @property
    def tier(self) -> str:
        """The tier of :meth:`embed` (used when this is passed as a plain Embedder)."""
        return "minilm" if self.full is not None else "static"

    def embed(self, texts: Sequence[str]) -> FloatArray:
        return np.asarray((self.full or self.static).embed(texts), dtype=np.float32)

    def cosines(self, pairs: Sequence[PairEvent]) -> list[PairCosine]:
        """Each pair's cosine (static or full), in order; at most one full ``embed`` call."""
        plan = self.static_pass(pairs)
        return [*self._merge(plan, self.full_pass(plan))]

    def static_pass(self, pairs: Sequence[PairEvent]) -> StaticPass:
        """The static tier on every pair and the rule's answer for each: the cheap half.

        Every pair whose ``reason`` is None is final here; :meth:`full_pass` settles
        the rest. Splitting a batch this way changes no cosine (each is a function of
        its pair), so the worker may send the final ones before the rest is embedded.
        """
        if not pairs:
            return StaticPass((), (), ())
        cands = [p.candidate.text for p in pairs]
        refs = [p.reference.text for p in pairs]
        raw = cosine_pairs(self.static, cands, refs)
        mapped = self.calibration.apply(raw)
        # Identical texts are identical under every model: no estimate, no escalation.
        same = np.fromiter((c == r for c, r in zip(cands, refs, strict=True)), bool, len(pairs))
        mapped[same] = 1.0
        values = tuple(float(s) for s in mapped)
        if self.full is None:
            return StaticPass(tuple(pairs), values, (None,) * len(pairs))
        reasons = tuple(
            escalation_reason(values[i], cands[i], refs[i], self.escalation, self.band)
            for i in range(len(pairs))
        )
        thresholds = self.escalation.thresholds
        passed_over = sum(
            reasons[i] is None
            and not same[i]
            and band_distance(values[i], thresholds, self.band) <= 1.0
            for i in range(len(pairs))
        )
        with self._lock:
            self.agreement.pairs += len(pairs)
            self.agreement.passed_over += passed_over
        return StaticPass(tuple(pairs), values, reasons)

    def full_pass(self, plan: StaticPass) -> dict[int, PairCosine]:
        """The full model's cosine of every escalated pair of ``plan``, in ONE ``embed`` call."""
        up = plan.escalated
        if not up or self.full is None:
            return {}
        cands = [plan.pairs[i].candidate.text for i in up]
        refs = [plan.pairs[i].reference.text for i in up]
        values = cosine_pairs(self.full, cands, refs)
        thresholds = self.escalation.thresholds
        out: dict[int, PairCosine] = {}
        with self._lock:
            self.full_calls += 1
            for i, v in zip(up, values, strict=True):
                s, m, reason = plan.mapped[i], float(v), plan.reasons[i]
                assert reason is not None  # escalated: a reason by construction
                self.agreement.escalated[reason] += 1
                if reason == "sample":
                    self.agreement.recent.append((s, m))
                    self.agreement.sample_abs_error_sum += abs(s - m)
                    self.agreement.sample_decision_flips += any(
                        (s < x) != (m < x) for x in thresholds
                    )
                out[i] = PairCosine(m, "minilm", s, m, reason)
        return out

    @staticmethod
    def _merge(plan: StaticPass, exact: dict[int, PairCosine]) -> list[PairCosine]:
        return [
            exact[i] if i in exact else PairCosine(s, "static", s)
            for i, s in enumerate(plan.mapped)
        ]

    def stage(self, pairs: Sequence[PairEvent]) -> Staged:
        """Metrics of the pairs that do not escalate; the plan for those that do."""
        plan = self.static_pass(pairs)
        ready = [i for i, r in enumerate(plan.reasons) if r is None]
        metrics = score_pairs(
            [plan.pairs[i] for i in ready],
            None,
            cosines=[(plan.mapped[i], "static") for i in ready],
        )
        return Staged(plan.pairs, dict(zip(ready, metrics, strict=True)), plan)

    def finish(self, staged: Staged) -> dict[int, Metrics]:
        """Metrics of the pairs :meth:`stage` left waiting (the full model's cosine)."""
        waiting = staged.waiting
        return dict(zip(waiting, self.finish_pairs([(staged, i) for i in waiting]), strict=True))

    def finish_pairs(self, units: Sequence[tuple[Staged, int]]) -> list[Metrics]:
        """Metrics of the waiting pairs ``(batch, index)``, in order, in ONE ``embed`` call.

        The worker's escalation lane finishes a few pairs at a time, so a batch staged
        meanwhile is not kept waiting for a whole backlog. Each pair's cosine is its
        own texts' (how pairs are grouped into calls changes no pair's inputs).
        """
        if not units:
            return []
        plans = [b.plan for b, _ in units]
        if any(p is None for p in plans):
            raise ValueError("only pairs a tiered stage left waiting can be finished")
        joined = StaticPass(
            tuple(b.pairs[i] for b, i in units),
            tuple(p.mapped[i] for p, (_, i) in zip(plans, units, strict=True) if p is not None),
            tuple(p.reasons[i] for p, (_, i) in zip(plans, units, strict=True) if p is not None),
        )
        exact = self.full_pass(joined)
        return score_pairs(
            joined.pairs,
            None,
            cosines=[(exact[j].cosine, exact[j].tier) for j in range(len(units))],
        )

    def score_pairs(self, pairs: Sequence[PairEvent]) -> list[Metrics]:
        """The full metric suite with tiered cosines: each pair's metrics depend on it alone."""
        staged = self.stage(pairs)
        done = {**staged.ready, **self.finish(staged)}
        return [done[i] for i in range(len(pairs))]
