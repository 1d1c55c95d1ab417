"""The scorer every scoring caller builds: eval, calibrate, score and replay, as the worker.

One entry over :func:`quantdrift.embedding.build_scorer`, so a command that
names no scorer gets exactly the worker's (``settings.embedding.tier``), and one
that names a tier gets that tier with the worker's other settings.
"""

from __future__ import annotations

from quantdrift.config import EmbeddingSettings
from quantdrift.detectors.semantic import Embedder
from quantdrift.embedding import factory


def build_embedder(
    embedding: EmbeddingSettings, tier: str | None = None
) -> tuple[Embedder | None, str]:
    """Exactly the scorer ``tier`` names (None: the worker's), and the tier it is.

    >>> scorer, tier = build_embedder(EmbeddingSettings(), "none")
    >>> (scorer, tier)
    (None, 'none')
    """
    if tier is not None:
        embedding = embedding.model_copy(update={"tier": tier})
    # Through the module, so the factory stays one seam (tests count what it builds).
    return factory.build_scorer(embedding), embedding.tier
