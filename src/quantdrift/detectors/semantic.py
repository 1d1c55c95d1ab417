"""Semantic similarity, the pure part: the ``Embedder`` protocol and the cosine of each pair.

Model loading (MiniLM, the static tier, the tiered scorer) lives in
:mod:`quantdrift.embedding`; the detectors only need something with ``embed``.

Lexical overlap punishes a correct paraphrase; embedding cosine does not, so it
is the primary similarity of a pair (Kurtic et al. report STS ~0.95 for healthy
quantized models where ROUGE-L sits near 0.46). The model runs on CPU inside
the score worker, so the embedder is batched (one ``encode`` per batch of
pairs), cached (the reference side of noise pairs and replays repeats) and
strictly offline (a worker must never block on, or leak to, the network).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float32]


@runtime_checkable
class Embedder(Protocol):
    """Anything that turns texts into L2-normalized embedding rows (one per text)."""

    def embed(self, texts: Sequence[str]) -> npt.NDArray[np.floating[Any]]: ...


def cosine_pairs(embedder: Embedder, cands: Sequence[str], refs: Sequence[str]) -> FloatArray:
    """Cosine of ``cands[i]`` and ``refs[i]`` for every i, with ONE ``embed`` call.

    Rows are unit vectors, so the cosine is their dot product (clipped to
    [-1, 1] against rounding).
    """
    if len(cands) != len(refs):
        raise ValueError(f"{len(cands)} candidates but {len(refs)} references")
    if not cands:
        return np.empty(0, dtype=np.float32)
    emb = np.asarray(embedder.embed([*cands, *refs]), dtype=np.float32)
    n = len(cands)
    cos = np.einsum("ij,ij->i", emb[:n], emb[n:])
    return np.clip(cos, -1.0, 1.0).astype(np.float32)
