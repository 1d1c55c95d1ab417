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
from quantdrift.embedding.tiered import Escalation, TieredScorer
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
        return SentenceTransformerEmbedder(
            model=settings.model,
            batch_size=settings.batch_size,
            threads=settings.threads,
            cache_size=settings.cache_size,
        )
    static = StaticEmbedder(settings.static_model)
    calibration = load_calibration(static.path, settings.calibration)
    full = (
        SentenceTransformerEmbedder(
            model=settings.model,
            batch_size=settings.batch_size,
            threads=settings.threads,
            cache_size=settings.cache_size,
        )
        if tier == "tiered"
        else None
    )
    escalation = Escalation(
        thresholds=tuple(settings.escalation_thresholds),
        band=settings.band,
        sample_rate=settings.sample_rate,
        rate=settings.escalation_rate,
    )
    return TieredScorer(static, full, calibration, escalation)


def score_with(scorer: Embedder | None, pairs: Sequence[PairEvent]) -> list[Metrics]:
    """:func:`score_pairs` for a plain embedder; the tiered path for a :class:`TieredScorer`.

    Either way each pair's metrics are a function of the pair and the settings,
    not of the batch it came in, so any worker (or a replay) gives the same.
    """
    if isinstance(scorer, TieredScorer):
        return scorer.score_pairs(pairs)
    return score_pairs(pairs, scorer)
