"""The tiered scorer keeps the detectors' contract: inputs untouched, deterministic,
state (calibration, escalation) survives JSON, documented by a doctest, real models agree."""

from __future__ import annotations

import copy
import json
from dataclasses import asdict

import numpy as np
import pytest

from quantdrift.embedding import static as static_tier
from quantdrift.embedding import tiered
from quantdrift.embedding.static import Calibration, StaticEmbedder, load_calibration
from quantdrift.embedding.tiered import Escalation, TieredScorer
from quantdrift.schemas import ModelOutput, PairEvent

TEXTS = [
    ("The capital of France is Paris.", "Paris is the capital of France."),
    ("Open Settings and click Reset password.", "Go to Settings, then Reset password."),
    ("the the the the the the the the", "Refunds are issued within 30 days."),
    ("长城是中国古代修建的军事防御工程。", "长城是中国古代的军事防御工程。"),
    ("", "An empty candidate."),
    ('{"name": "Ada", "name": "Ada"', '{"name": "Ada", "email": "ada@example.com"}'),
]


def pairs() -> list[PairEvent]:
    return [
        PairEvent(
            pair_id=f"c-{i}",
            route=f"r/{i % 2}",
            ts=0.0,
            candidate=ModelOutput(text=c),
            reference=ModelOutput(text=r),
        )
        for i, (c, r) in enumerate(TEXTS)
    ]


@pytest.fixture(scope="module")
def static() -> StaticEmbedder:
    return StaticEmbedder()


def test_modules_document_themselves() -> None:
    for module in (static_tier, tiered):
        assert module.__doc__ and ">>>" in (
            module.__doc__ + "".join((getattr(module, n).__doc__ or "") for n in dir(module))
        )


def test_calibration_and_escalation_survive_json(static: StaticEmbedder) -> None:
    cal = load_calibration(static.path)
    assert Calibration.from_json(cal.to_json()) == cal
    esc = Escalation(thresholds=(0.88, 0.85), band=0.07, sample_rate=0.05, rate=0.02)
    raw = json.loads(json.dumps(asdict(esc)))
    assert Escalation(**{**raw, "thresholds": tuple(raw["thresholds"])}) == esc


def test_static_only_is_deterministic_and_leaves_input_alone(static: StaticEmbedder) -> None:
    batch = pairs()
    before = copy.deepcopy(batch)
    runs = [
        [
            (m.cosine, m.cosine_tier)
            for m in TieredScorer(static, None, load_calibration(static.path)).score_pairs(batch)
        ]
        for _ in range(2)
    ]
    assert runs[0] == runs[1]
    assert batch == before
    cosines = [c for c, _ in runs[0]]
    assert all(c is None or -1.0 <= c <= 1.0 for c in cosines)
    assert {t for _, t in runs[0]} == {"static"}


@pytest.mark.slow
def test_escalated_cosines_equal_minilm(static: StaticEmbedder) -> None:
    from quantdrift.detectors.semantic import cosine_pairs
    from quantdrift.embedding.minilm import SentenceTransformerEmbedder

    full = SentenceTransformerEmbedder(threads=1)
    scorer = TieredScorer(static, full, load_calibration(static.path), Escalation(sample_rate=1.0))
    batch = pairs()
    metrics = scorer.score_pairs(batch)
    exact = cosine_pairs(full, [p.candidate.text for p in batch], [p.reference.text for p in batch])
    for m, e, p in zip(metrics, exact, batch, strict=True):
        if p.candidate.text == p.reference.text:
            continue
        assert m.cosine_tier == "minilm"
        assert m.cosine == pytest.approx(float(e), abs=1e-6)
    assert scorer.full_calls == 1
    assert np.isfinite(scorer.agreement.summary()["sample_mean_abs_error"])


def test_a_pairs_score_does_not_depend_on_its_batch(static: StaticEmbedder) -> None:
    """The real static tier: one pair's metrics are the same alone, in a batch, in any
    order, after any history (the escalation rule's argument rests on this)."""
    cal = load_calibration(static.path)
    esc = Escalation(sample_rate=0.3, rate=0.5)  # both reasons in play on six pairs
    batch = pairs()
    # The static model stands in for the full one: the escalation path runs, no MiniLM.
    first = TieredScorer(static, static, cal, esc).score_pairs(batch)
    other = TieredScorer(static, static, cal, esc)
    other.score_pairs(list(reversed(batch)) * 3)
    alone = [other.score_pairs([p])[0] for p in batch]
    assert [m.model_dump() for m in alone] == [m.model_dump() for m in first]
    assert {m.cosine_tier for m in first} >= {"static", "minilm"}
