"""score_pairs / score_text_pair / verdict, with a fake embedder (no model)."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from quantdrift.detectors.suite import FailureThresholds, score_pairs, score_text_pair, verdict
from quantdrift.schemas import Metrics, ModelOutput, PairEvent, RequestInfo


class FakeEmbedder:
    """Bag-of-characters unit vectors; counts embed calls."""

    tier = "fake"

    def __init__(self) -> None:
        self.calls: list[int] = []

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        self.calls.append(len(texts))
        out = np.zeros((len(texts), 64), dtype=np.float32)
        for i, t in enumerate(texts):
            for ch in t or " ":
                out[i, hashlib.sha1(ch.encode("utf-8", "surrogatepass")).digest()[0] % 64] += 1
        return out / np.linalg.norm(out, axis=1, keepdims=True)


def pair(
    cand_text: str,
    ref_text: str,
    cand: dict[str, Any] | None = None,
    ref: dict[str, Any] | None = None,
    **kw: Any,
) -> PairEvent:
    request = kw.pop("request", RequestInfo())
    return PairEvent(
        pair_id=kw.pop("pair_id", "p1"),
        ts=1.0,
        route="cs/int4",
        candidate=ModelOutput(text=cand_text, **(cand or {})),
        reference=ModelOutput(text=ref_text, **(ref or {})),
        request=request,
        **kw,
    )


def test_score_pairs_one_embed_call_per_batch() -> None:
    emb = FakeEmbedder()
    pairs = [pair(f"answer {i}", "the reference", pair_id=f"p{i}") for i in range(5)]
    metrics = score_pairs(pairs, emb)
    assert emb.calls == [10]
    assert len(metrics) == 5
    assert all(m.cosine is not None and m.cosine_tier == "fake" for m in metrics)


def test_score_pairs_without_embedder() -> None:
    (m,) = score_pairs([pair("a b c", "a b d")], None)
    assert m.cosine is None and m.cosine_tier is None
    assert m.rouge1 == pytest.approx(2 / 3)
    assert score_pairs([], None) == []


def test_all_fields_filled_from_a_rich_pair() -> None:
    lp = math.log(0.5)
    p = pair(
        '{"name": "Ada"}',
        '{"name": "Ada", "age": 36}',
        request=RequestInfo(expected_keys=["name", "age"]),
        cand={"top_logprobs": [{"a": lp, "b": lp}], "entropy": [0.2, 0.4]},
        ref={"top_logprobs": [{"a": 0.0}], "entropy": [0.1], "token_logprobs": [-0.1, -0.3]},
        reference_logprobs_on_candidate=[-1.0, -1.0],
    )
    (m,) = score_pairs([p], FakeEmbedder())
    assert m.entropy_mean == pytest.approx(0.3)
    assert m.entropy_min == pytest.approx(0.2)
    assert m.entropy_shift == pytest.approx(0.2)
    assert m.kl is not None and m.kl > 0
    assert m.flip_rate == 0.0
    assert m.tf_gap == pytest.approx(0.8)
    assert m.json_ok is False and m.json_error == "json: missing key 'age'"
    assert m.candidate_tokens == 2 and m.reference_tokens == 4
    assert verdict(m)[0] == "anomaly"


def test_score_text_pair() -> None:
    m = score_text_pair("我喜欢猫", "我喜欢狗", FakeEmbedder())
    assert m.rouge1 == pytest.approx(0.75)
    assert m.json_ok is None and m.entropy_mean is None
    assert m.cosine is not None and -1.0 <= m.cosine <= 1.0


@pytest.mark.parametrize(
    ("metrics", "expected", "reasons"),
    [
        (Metrics(cosine=0.95), "ok", []),
        (Metrics(cosine=0.71), "drift", ["cosine 0.71 < 0.88"]),
        (Metrics(cosine=0.95, looping=True, reference_looping=False), "anomaly", ["looping tail"]),
        (Metrics(cosine=0.95, looping=True, reference_looping=True), "ok", []),
        (
            Metrics(cosine=0.95, repetition_run=6, reference_repetition_run=1),
            "anomaly",
            ["repetition loop (6x)"],
        ),
        # The reference repeats too ("say it five times"): excused.
        (Metrics(cosine=0.95, repetition_run=6, reference_repetition_run=5), "ok", []),
        (Metrics(cosine=0.95, repetition_run=3), "ok", []),
        (
            Metrics(cosine=0.95, json_ok=False, json_error="json: missing key 'name'"),
            "anomaly",
            ["json: missing key 'name'"],
        ),
        (Metrics(cosine=0.95, json_ok=None), "ok", []),
        (
            Metrics(cosine=0.95, entropy_mean=0.01, candidate_tokens=40),
            "anomaly",
            ["entropy 0.010 < 0.05 nats"],
        ),
        (Metrics(cosine=0.95, entropy_mean=0.01, candidate_tokens=3), "ok", []),  # short
        # The reference is just as certain (shift ~0): canned answer, not collapse.
        (
            Metrics(cosine=0.95, entropy_mean=0.01, entropy_shift=-0.005, candidate_tokens=40),
            "ok",
            [],
        ),
        (
            Metrics(cosine=0.95, entropy_mean=0.01, entropy_shift=-0.5, candidate_tokens=40),
            "anomaly",
            ["entropy 0.010 < 0.05 nats"],
        ),
        (
            Metrics(cosine=0.95, whitespace_run=500, reference_whitespace_run=2),
            "anomaly",
            ["whitespace run 500"],
        ),
        (Metrics(cosine=0.5, looping=True), "anomaly", ["looping tail", "cosine 0.50 < 0.88"]),
        # No cosine: ROUGE-L against its own, lower, threshold.
        (Metrics(rougeL=0.5, first_divergence=3, candidate_tokens=9), "ok", []),
        (
            Metrics(rougeL=0.2, first_divergence=0, candidate_tokens=9),
            "drift",
            ["rougeL 0.20 < 0.35 (no cosine)"],
        ),
        # Two empty texts: ROUGE 0 by convention, but identical -> not drift.
        (Metrics(rougeL=0.0, first_divergence=None, candidate_tokens=0), "ok", []),
        (Metrics(), "ok", []),
    ],
)
def test_verdict(metrics: Metrics, expected: str, reasons: list[str]) -> None:
    assert verdict(metrics) == (expected, reasons)


def test_verdict_thresholds_are_parameters() -> None:
    assert verdict(Metrics(cosine=0.9), FailureThresholds(similarity=0.95))[0] == "drift"
    with pytest.raises(ValueError):
        FailureThresholds(repetition_run=1)


def test_end_to_end_loop_is_anomaly() -> None:
    (m,) = score_pairs([pair("Sure. " + "I am sorry. " * 20, "Sure, here is the answer.")], None)
    v, reasons = verdict(m)
    assert v == "anomaly"
    assert "looping tail" in reasons and any(r.startswith("repetition loop") for r in reasons)
