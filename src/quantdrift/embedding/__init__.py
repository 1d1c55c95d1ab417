"""Scoring with models: MiniLM, the static tier, the tiered scorer, distillation.

``quantdrift.detectors`` keeps the pure metrics, verdicts, tests and floors;
everything that loads a model lives here, behind one :class:`Scorer` protocol
and one factory (:func:`build_scorer`, :func:`score_with`) used by the worker,
replay, eval, ``score`` and ``calibrate``.
"""

from quantdrift.embedding.factory import Scorer, build_scorer, score_with
from quantdrift.embedding.minilm import (
    PACKAGED_MINILM,
    SentenceTransformerEmbedder,
    resolve_model_path,
)

__all__ = [
    "PACKAGED_MINILM",
    "Scorer",
    "SentenceTransformerEmbedder",
    "build_scorer",
    "resolve_model_path",
    "score_with",
]
