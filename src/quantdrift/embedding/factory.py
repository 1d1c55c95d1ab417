"""One ``Scorer`` protocol and one factory: the worker, replay, eval, score and
calibrate all build their scorer here, so replay reproduces live decisions.

``tier`` in :class:`~quantdrift.config.EmbeddingSettings`:

* ``minilm``: the transformer on every pair (:class:`SentenceTransformerEmbedder`);
* ``tiered``: static cosine on every pair, MiniLM on the pairs that can change
  a decision (:class:`~quantdrift.embedding.tiered.TieredScorer`);
* ``static``: the static tier alone, calibrated onto MiniLM's scale;
* ``none``: no cosine (the verdict falls back to ROUGE-L).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from quantdrift.detectors.semantic import Embedder
from quantdrift.detectors.suite import score_pairs
from quantdrift.embedding.minilm import SentenceTransformerEmbedder
from quantdrift.embedding.static import StaticEmbedder, load_calibration
from quantdrift.embedding.tiered import Escalation, Staged, TieredScorer
from quantdrift.schemas.pair import PairEvent
from quantdrift.schemas.score import Metrics

if TYPE_CHECKING:
    from quantdrift.config import EmbeddingSettings


@runtime_checkable
class Scorer(Protocol):
    """What the factory builds: texts in, L2-normalized rows out (``embed``). The
    tiered scorer adds ``score_pairs`` (its own escalation); :func:`score_with`
    calls whichever a scorer has, so callers never branch on the type."""

    def embed(self, texts: Sequence[str]) -> object: ...


def build_scorer(settings: EmbeddingSettings) -> Embedder | None:
    """The scorer ``settings`` ask for; None when semantic scoring is off."""
    tier = getattr(settings, "tier", "minilm")
    if tier == "none" or settings.model == "none":
        return None
    if tier == "minilm":
        return _minilm(settings)
    static = StaticEmbedder(settings.static_model)
    calibration = load_calibration(static.path, settings.calibration)
    full = _minilm(settings) if tier == "tiered" else None
    escalation = Escalation(
        thresholds=tuple(settings.escalation_thresholds),
        band=settings.band,
        sample_rate=settings.sample_rate,
        rate=settings.escalation_rate,
    )
    return TieredScorer(static, full, calibration, escalation)


def _minilm(settings: EmbeddingSettings) -> SentenceTransformerEmbedder:
    """The one place MiniLM is built from settings, for the minilm and tiered tiers alike."""
    return SentenceTransformerEmbedder(
        model=settings.model,
        batch_size=settings.batch_size,
        threads=settings.threads,
        cache_size=settings.cache_size,
        dtype=settings.dtype,
    )


def score_with(scorer: Embedder | None, pairs: Sequence[PairEvent]) -> list[Metrics]:
    """:func:`score_pairs` for a plain embedder; the tiered path for a :class:`TieredScorer`.

    Either way each pair's metrics are a function of the pair and the settings,
    not of the batch it came in, so any worker (or a replay) gives the same.
    """
    staged = stage_scores(scorer, pairs)
    done = {**staged.ready, **finish_scores(scorer, staged)}
    return [done[i] for i in range(len(pairs))]


def stage_scores(scorer: Embedder | None, pairs: Sequence[PairEvent]) -> Staged:
    """The cheap half of :func:`score_with`: final metrics for every pair that needs no
    escalation, and what the rest needs (the tiered scorer's plan).

    The worker sends the ready pairs' scores at once and finishes the rest on its own
    lane; :func:`score_with` is these two calls in a row, so both give the same metrics.
    A scorer without tiers has every pair ready.
    """
    if isinstance(scorer, TieredScorer):
        return scorer.stage(pairs)
    metrics = score_pairs(pairs, scorer)
    return Staged(tuple(pairs), dict(enumerate(metrics)))


def finish_scores(scorer: Embedder | None, staged: Staged) -> dict[int, Metrics]:
    """Metrics of the pairs :func:`stage_scores` left waiting, by index (the expensive half)."""
    waiting = staged.waiting
    found = finish_pair_scores(scorer, [(staged, i) for i in waiting])
    return dict(zip(waiting, found, strict=True))


def finish_pair_scores(
    scorer: Embedder | None, units: Sequence[tuple[Staged, int]]
) -> list[Metrics]:
    """Metrics of some waiting pairs, ``(staged batch, index)``, the full model called once."""
    if not units:
        return []
    if not isinstance(scorer, TieredScorer):
        raise ValueError("only a tiered scorer leaves pairs waiting for the full model")
    return scorer.finish_pairs(units)
