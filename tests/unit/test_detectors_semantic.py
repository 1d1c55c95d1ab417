"""The packaged MiniLM: offline, batched, cached. Loads a real model (slow)."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from quantdrift.detectors.semantic import cosine_pairs
from quantdrift.detectors.suite import score_pairs
from quantdrift.embedding.minilm import SentenceTransformerEmbedder, resolve_model_path
from quantdrift.errors import ConfigError
from quantdrift.schemas import ModelOutput, PairEvent

pytestmark = pytest.mark.slow

CONNECTS: list[Any] = []


@pytest.fixture(scope="module")
def embedder() -> Iterator[SentenceTransformerEmbedder]:
    # Any attempt to open a socket while loading or encoding is recorded and refused.
    def refuse(self: socket.socket, address: Any) -> None:
        CONNECTS.append(address)
        raise OSError("network disabled in this test")

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(socket.socket, "connect", refuse)
        mp.setattr(socket.socket, "connect_ex", refuse)
        model = SentenceTransformerEmbedder(cache_size=64)
        model.embed(["warm up the network guard"])
        yield model


def test_never_touches_the_network(embedder: SentenceTransformerEmbedder) -> None:
    assert CONNECTS == []
    assert os.environ.get("HF_HUB_OFFLINE")
    assert os.environ.get("TRANSFORMERS_OFFLINE")


def test_unit_rows(embedder: SentenceTransformerEmbedder) -> None:
    emb = embedder.embed(["hello", "", "你好世界", "😀"])
    assert emb.shape == (4, embedder.dim) and emb.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(emb, axis=1), 1.0, atol=1e-5)
    assert embedder.embed([]).shape == (0, embedder.dim)


def test_paraphrase_beats_unrelated(embedder: SentenceTransformerEmbedder) -> None:
    cos = cosine_pairs(
        embedder,
        ["A man is playing a guitar.", "A man is playing a guitar."],
        ["Someone plays the guitar.", "The stock market fell sharply today."],
    )
    assert cos[0] > 0.7 > 0.3 > cos[1]


def test_batch_equals_one_at_a_time(embedder: SentenceTransformerEmbedder) -> None:
    texts = [f"sentence number {i} about {'cats' if i % 2 else 'the weather'}" for i in range(9)]
    fresh = SentenceTransformerEmbedder.__new__(SentenceTransformerEmbedder)
    fresh.__dict__.update(embedder.__dict__)
    fresh._cache = type(embedder._cache)()  # same model, empty cache
    batch = fresh.embed(texts)
    fresh._cache.clear()
    single = np.stack([fresh.embed([t])[0] for t in texts])
    np.testing.assert_allclose(batch, single, atol=1e-5)


def test_cache_hits_skip_encode(embedder: SentenceTransformerEmbedder) -> None:
    calls: list[int] = []
    original = embedder._model.encode

    def counting(texts: list[str], **kw: Any) -> Any:
        calls.append(len(texts))
        return original(texts, **kw)

    embedder._model.encode = counting
    try:
        first = embedder.embed(["cache me", "and me", "cache me"])
        second = embedder.embed(["and me", "cache me"])
        third = embedder.embed(["and me", "new one"])
    finally:
        embedder._model.encode = original
    assert calls == [2, 1]  # deduplicated, then only the new text
    np.testing.assert_array_equal(first[0], second[1])
    np.testing.assert_array_equal(first[1], third[0])


def test_cache_is_bounded(embedder: SentenceTransformerEmbedder) -> None:
    embedder.embed([f"filler {i}" for i in range(200)])
    assert len(embedder._cache) <= embedder.cache_size


def test_score_pairs_with_minilm(embedder: SentenceTransformerEmbedder) -> None:
    pairs = [
        PairEvent(
            pair_id=f"p{i}",
            ts=0.0,
            route="r",
            candidate=ModelOutput(text=c),
            reference=ModelOutput(text=r),
        )
        for i, (c, r) in enumerate(
            [
                ("The capital of France is Paris.", "Paris is the capital of France."),
                ("I like turtles.", "The mitochondria is the powerhouse of the cell."),
            ]
        )
    ]
    same, other = score_pairs(pairs, embedder)
    assert same.cosine is not None and other.cosine is not None
    assert same.cosine > 0.9 and other.cosine < 0.5
    assert same.cosine_tier == "minilm"


def test_unknown_model_is_a_config_error() -> None:
    with pytest.raises(ConfigError):
        resolve_model_path("sentence-transformers/all-MiniLM-L6-v2")  # a hub name: refused


def test_bfloat16_gives_float32_unit_rows_close_to_float32(
    embedder: SentenceTransformerEmbedder,
) -> None:
    """``embedding.dtype: bfloat16`` changes the arithmetic, not the contract: float32
    unit rows, and cosines within bf16's rounding of float32's (the bench measures
    < 0.01 on long pairs; a wrong cast, e.g. weights left float32 under bf16 input,
    either fails to run or lands far away)."""
    bf16 = SentenceTransformerEmbedder(cache_size=0, dtype="bfloat16")
    assert bf16.dtype == "bfloat16"
    assert next(bf16._model.parameters()).dtype.__repr__() == "torch.bfloat16"
    texts = ["A man is playing a guitar.", "Someone plays the guitar.", "Stocks fell today."]
    got, want = bf16.embed(texts), embedder.embed(texts)
    assert got.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    cos_got = cosine_pairs(bf16, texts[:2] + texts[:1], texts[1:] + texts[2:])
    cos_want = cosine_pairs(embedder, texts[:2] + texts[:1], texts[1:] + texts[2:])
    assert np.max(np.abs(np.asarray(cos_got) - np.asarray(cos_want))) < 0.02
    assert not np.array_equal(got, want)  # bf16 really ran


def test_an_unknown_dtype_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="float16"):
        SentenceTransformerEmbedder(dtype="float16")
