"""Tiered scoring: which pairs escalate, one batched full call, tiers recorded. No model."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pytest

from quantdrift.embedding.factory import score_with
from quantdrift.embedding.static import Calibration
from quantdrift.embedding.tiered import (
    Escalation,
    RouteWatch,
    TieredScorer,
    escalation_reason,
    sampled,
)
from quantdrift.schemas import ModelOutput, PairEvent

IDENTITY = Calibration(band=0.05)


class FakeEmbedder:
    """Texts ``ref:<x>`` embed to e0; ``cand:<cos>:<x>`` to a unit vector at that cosine."""

    def __init__(self, tier: str, scale: float = 1.0) -> None:
        self.tier = tier
        self.scale = scale  # the full model's cosine = 1 - scale * (1 - static cosine)
        self.calls: list[list[str]] = []

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        self.calls.append(list(texts))
        rows = []
        for t in texts:
            if t.startswith("cand:"):
                c = 1 - self.scale * (1 - float(t.split(":")[1]))
                rows.append([c, math.sqrt(max(0.0, 1 - c * c))])
            else:
                rows.append([1.0, 0.0])
        return np.asarray(rows, dtype=np.float32)


def pair(i: int, cos: float, route: str = "r/a", pid: str | None = None) -> PairEvent:
    return PairEvent(
        pair_id=pid or f"p-{i}",
        route=route,
        ts=0.0,
        candidate=ModelOutput(text=f"cand:{cos}:{i}"),
        reference=ModelOutput(text=f"ref:{i}"),
    )


def scorer(sample_rate: float = 0.0, band: float | None = None, full_scale: float = 1.0):
    static, full = FakeEmbedder("static"), FakeEmbedder("minilm", full_scale)
    esc = Escalation(
        thresholds=(0.88,), band=band, sample_rate=sample_rate, watch_pairs=3, max_rate=None
    )
    return TieredScorer(static, full, IDENTITY, esc), static, full


@pytest.mark.parametrize(
    ("mapped", "route", "suspicious", "pid", "rate", "expected"),
    [
        (0.88, "r", (), "p", 0.0, "band"),
        (0.835, "r", (), "p", 0.0, "band"),  # near the lower edge of the band
        (0.925, "r", (), "p", 0.0, "band"),
        (0.82, "r", (), "p", 0.0, None),
        (0.94, "r", (), "p", 0.0, None),
        (0.99, "r", {"r"}, "p", 0.0, "suspicious"),
        (0.99, "r", {"other"}, "p", 0.0, None),
        (0.10, "r", (), "p", 1.0, "sample"),
        (0.88, "r", {"r"}, "p", 1.0, "sample"),  # first reason wins
        (0.88, "r", {"r"}, "p", 0.0, "band"),
    ],
)
def test_escalation_reason(mapped, route, suspicious, pid, rate, expected) -> None:
    assert escalation_reason(mapped, route, pid, suspicious, (0.88,), 0.05, rate) == expected


def test_sample_is_deterministic_and_near_rate() -> None:
    ids = [f"pair-{i}" for i in range(20_000)]
    first = [sampled(i, 0.02) for i in ids]
    assert first == [sampled(i, 0.02) for i in ids]
    assert 0.015 < sum(first) / len(ids) < 0.025


def test_band_pairs_escalate_in_one_full_call() -> None:
    tiered, static, full = scorer()
    cosines = [0.99, 0.90, 0.50, 0.86, 0.97, 0.80]
    pairs = [pair(i, c, route=f"r/{i % 3}") for i, c in enumerate(cosines)]
    found = tiered.cosines(pairs)
    assert [c.tier for c in found] == ["static", "minilm", "static", "minilm", "static", "static"]
    assert [c.reason for c in found] == [None, "band", None, "band", None, None]
    assert len(static.calls) == 1 and len(full.calls) == 1
    # One call for both escalated pairs, across routes: 2 candidates + 2 references.
    assert len(full.calls[0]) == 4
    assert found[1].static == pytest.approx(0.90, abs=1e-5)
    assert found[1].minilm == pytest.approx(0.90, abs=1e-5)


def test_no_escalation_means_no_full_call() -> None:
    tiered, _, full = scorer()
    found = tiered.cosines([pair(i, 0.99) for i in range(5)])
    assert full.calls == [] and {c.tier for c in found} == {"static"}
    assert tiered.full_calls == 0


def test_suspicious_routes_escalate_every_pair() -> None:
    tiered, _, full = scorer()
    pairs = [pair(0, 0.99, "hot"), pair(1, 0.99, "cold"), pair(2, 0.2, "hot")]
    found = tiered.cosines(pairs, suspicious={"hot"})
    assert [c.reason for c in found] == ["suspicious", None, "suspicious"]
    assert len(full.calls) == 1


def test_sampled_pairs_record_both_cosines() -> None:
    tiered, _, _ = scorer(sample_rate=1.0, full_scale=2.0)
    found = tiered.cosines([pair(0, 0.99)])
    assert found[0].reason == "sample" and found[0].tier == "minilm"
    assert found[0].static == pytest.approx(0.99, abs=1e-5)
    assert found[0].minilm == pytest.approx(0.98, abs=1e-5)
    summary = tiered.agreement.summary()
    assert summary["escalated_sample"] == 1
    assert summary["sample_mean_abs_error"] == pytest.approx(0.01, abs=1e-4)
    assert list(tiered.agreement.recent) == [pytest.approx((0.99, 0.98), abs=1e-5)]


def test_identical_texts_never_escalate() -> None:
    tiered, _, full = scorer(sample_rate=1.0)
    p = PairEvent(
        pair_id="same",
        route="r",
        ts=0.0,
        candidate=ModelOutput(text="ref:1"),
        reference=ModelOutput(text="ref:1"),
    )
    assert tiered.cosines([p], suspicious={"r"})[0] == tiered.cosines([p])[0]
    assert tiered.cosines([p])[0].cosine == 1.0 and full.calls == []


def test_failures_make_a_route_suspicious_for_watch_pairs() -> None:
    tiered, _, _ = scorer()
    metrics = tiered.score_pairs([pair(0, 0.2, "r/x")])  # a drift: cosine far below 0.88
    assert metrics[0].cosine_tier == "static"
    assert tiered.watch.suspicious() == {"r/x"}
    tiers = [tiered.score_pairs([pair(i, 0.99, "r/x")])[0].cosine_tier for i in range(1, 5)]
    assert tiers == ["minilm", "minilm", "minilm", "static"]  # watch_pairs=3


def test_route_watch_forgets() -> None:
    watch = RouteWatch(pairs=2)
    watch.observe("a", True)
    watch.observe("a", False)
    assert watch.suspicious() == {"a"}
    watch.observe("a", False)
    assert watch.suspicious() == frozenset()


def test_metrics_carry_tier_and_mapped_cosine() -> None:
    cal = Calibration(knots_x=(0.0, 1.0), knots_y=(-0.5, 1.0), band=0.01)
    static, full = FakeEmbedder("static"), FakeEmbedder("minilm")
    tiered = TieredScorer(static, full, cal, Escalation(sample_rate=0.0, max_rate=None))
    m = score_with(tiered, [pair(0, 0.5), pair(1, 0.92)])
    assert m[0].cosine == pytest.approx(0.25, abs=1e-5) and m[0].cosine_tier == "static"
    # 0.92 maps to 0.88: in the band, so the full model's cosine is used.
    assert m[1].cosine == pytest.approx(0.92, abs=1e-5) and m[1].cosine_tier == "minilm"


def test_static_only_never_calls_a_full_model() -> None:
    static = FakeEmbedder("static")
    tiered = TieredScorer(static, None, IDENTITY, Escalation(sample_rate=1.0))
    m = score_with(tiered, [pair(0, 0.88)], suspicious={"r/a"})
    assert m[0].cosine_tier == "static"


def test_plain_embedder_goes_through_score_pairs() -> None:
    full = FakeEmbedder("minilm")
    m = score_with(full, [pair(0, 0.7)])
    assert m[0].cosine == pytest.approx(0.7, abs=1e-5) and m[0].cosine_tier == "minilm"
    assert score_with(None, [pair(0, 0.7)])[0].cosine is None


def test_deterministic() -> None:
    pairs = [pair(i, c, route=f"r/{i % 2}") for i, c in enumerate(np.linspace(0.5, 1.0, 40))]
    runs = []
    for _ in range(2):
        tiered, _, _ = scorer(sample_rate=0.1)
        runs.append([(m.cosine, m.cosine_tier) for m in tiered.score_pairs(pairs)])
    assert runs[0] == runs[1]


def test_budget_takes_the_closest_pairs_and_counts_the_rest() -> None:
    static, full = FakeEmbedder("static"), FakeEmbedder("minilm")
    esc = Escalation(band=0.05, sample_rate=0.0, max_rate=0.25, burst=2)
    tiered = TieredScorer(static, full, IDENTITY, esc)
    cosines = [0.99, 0.91, 0.881, 0.85, 0.87, 0.99, 0.99, 0.99]  # 4 in the band
    found = tiered.cosines([pair(i, c) for i, c in enumerate(cosines)])
    # Credit: burst 2 (capped), so the two closest to 0.88 escalate.
    assert [i for i, c in enumerate(found) if c.tier == "minilm"] == [2, 4]
    assert tiered.agreement.over_budget == 2
    assert len(full.calls) == 1
    # Spent: the next batch of 4 earns 1 credit.
    found = tiered.cosines([pair(10 + i, c) for i, c in enumerate([0.9, 0.88, 0.86, 0.99])])
    assert [c.tier for c in found] == ["static", "minilm", "static", "static"]


def test_suspicious_pairs_rank_ahead_at_equal_distance() -> None:
    static, full = FakeEmbedder("static"), FakeEmbedder("minilm")
    esc = Escalation(band=0.05, sample_rate=0.0, max_rate=0.0, burst=1)
    tiered = TieredScorer(static, full, IDENTITY, esc)
    found = tiered.cosines([pair(0, 0.90, "cold"), pair(1, 0.90, "hot")], suspicious={"hot"})
    assert [c.tier for c in found] == ["static", "minilm"]
