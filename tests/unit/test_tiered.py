"""Tiered scoring: which pairs escalate, one batched full call, tiers recorded, and a
pair's score a function of the pair (not of the scorer's history). No model."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pytest

from quantdrift.detectors.suite import score_event
from quantdrift.embedding.factory import score_with
from quantdrift.embedding.static import Calibration
from quantdrift.embedding.tiered import (
    Escalation,
    TieredScorer,
    band_distance,
    draw,
    escalation_reason,
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


def scorer(
    sample_rate: float = 0.0,
    band: float | None = None,
    full_scale: float = 1.0,
    rate: float | None = None,
):
    static, full = FakeEmbedder("static"), FakeEmbedder("minilm", full_scale)
    esc = Escalation(thresholds=(0.88,), band=band, sample_rate=sample_rate, rate=rate)
    return TieredScorer(static, full, IDENTITY, esc), static, full


def reason(mapped: float, cand: str = "c", ref: str = "r", **kw) -> str | None:  # type: ignore[no-untyped-def]
    esc = Escalation(**{"thresholds": (0.88,), "sample_rate": 0.0, "rate": None, **kw})
    return escalation_reason(mapped, cand, ref, esc, band=0.05)


@pytest.mark.parametrize(
    ("mapped", "kw", "expected"),
    [
        (0.88, {}, "band"),
        (0.835, {}, "band"),  # near the lower edge of the band
        (0.925, {}, "band"),
        (0.82, {}, None),
        (0.94, {}, None),
        (0.10, {"sample_rate": 1.0}, "sample"),
        (0.88, {"sample_rate": 1.0}, "sample"),  # first reason wins
        # With a rate: on the bar always, within rate band widths of it always.
        (0.88, {"rate": 0.005}, "band"),
        (0.88, {"rate": 0.0}, None),  # rate 0: the band alone escalates nothing
        (0.88 - 0.004 * 0.05, {"rate": 0.005}, "band"),
        (0.88 + 0.004 * 0.05, {"rate": 0.005}, "band"),
        (0.94, {"rate": 1.0}, None),  # outside the band, whatever the rate
        (0.90, {"thresholds": (0.80, 0.90)}, "band"),  # the nearest threshold counts
    ],
)
def test_escalation_reason(mapped, kw, expected) -> None:  # type: ignore[no-untyped-def]
    assert reason(mapped, **kw) == expected


def test_identical_texts_never_escalate_by_the_rule() -> None:
    assert reason(0.88, "same", "same", sample_rate=1.0) is None


def test_band_draw_admits_min_one_rate_over_d() -> None:
    """In the band a pair escalates with probability min(1, rate / d), drawn from its texts."""
    rate, n = 0.02, 20_000
    for d in (0.01, 0.1, 0.5, 0.9):
        mapped = 0.88 + d * 0.05
        share = sum(reason(mapped, f"c{i}", f"r{i}", rate=rate) == "band" for i in range(n)) / n
        expected = min(1.0, rate / d)
        assert abs(share - expected) <= 4 * math.sqrt(expected * (1 - expected) / n) + 1e-9, d


def test_band_spread_evenly_costs_rate_times_one_plus_log() -> None:
    """The cost bound in the module docstring, at the default rate, on a band packed evenly."""
    rate, n = Escalation().rate, 40_000
    assert rate is not None
    offsets = np.linspace(-1.0, 1.0, n)
    share = (
        sum(
            reason(0.88 + x * 0.05, f"c{i}", f"r{i}", rate=rate) == "band"
            for i, x in enumerate(offsets)
        )
        / n
    )
    assert share == pytest.approx(rate * (1 + math.log(1 / rate)), rel=0.1)


def test_draws_are_fixed_by_the_texts_and_independent_by_purpose() -> None:
    texts = [(f"cand {i}", f"ref {i}") for i in range(20_000)]
    first = [draw(c, r, "sample") < 0.02 for c, r in texts]
    assert first == [draw(c, r, "sample") < 0.02 for c, r in texts]
    assert 0.015 < sum(first) / len(texts) < 0.025
    band = [draw(c, r, "band") < 0.02 for c, r in texts]
    both = sum(a and b for a, b in zip(first, band, strict=True)) / len(texts)
    assert both < 0.002  # ~0.02 * 0.02 if independent, 0.02 if the same draw
    assert draw("ab", "c", "band") != draw("a", "bc", "band")


def test_band_distance_uses_the_nearest_threshold() -> None:
    assert band_distance(0.86, (0.88, 0.85), 0.02) == pytest.approx(0.5)
    assert band_distance(0.88, (0.88,), 0.0) == 0.0
    assert band_distance(0.89, (0.88,), 0.0) == math.inf


def history(seed: int, n: int, route: str = "r/a") -> list[PairEvent]:
    """Pairs a scorer saw before: failing, near the bar, clear, on the same route."""
    rng = np.random.default_rng(seed)
    cos = rng.choice([0.2, 0.5, 0.87, 0.88, 0.89, 0.99], size=n)
    return [pair(1000 * seed + i, float(c), route, f"h-{seed}-{i}") for i, c in enumerate(cos)]


def test_same_pair_same_score_whatever_the_scorer_saw_before() -> None:
    """Two scorers with different histories and batchings give identical ScoreEvents."""
    probe = [pair(i, float(c), "r/a") for i, c in enumerate(np.linspace(0.80, 0.96, 60))]
    probe += [pair(100, 0.2, "r/a"), pair(101, 0.99, "r/b")]
    events = []
    for seed, batch in ((1, 64), (2, 1)):
        tiered, _, _ = scorer(sample_rate=0.1, rate=0.05)
        past = history(seed, 300 * seed)
        for i in range(0, len(past), 7 * seed):  # different batch sizes as well
            tiered.score_pairs(past[i : i + 7 * seed])
        order = probe if seed == 1 else probe[::-1]  # other batches, other order
        got: dict[str, object] = {}
        for i in range(0, len(order), batch):
            chunk = order[i : i + batch]
            for p, m in zip(chunk, tiered.score_pairs(chunk), strict=True):
                got[p.pair_id] = score_event(p, m).model_dump()
        events.append(got)
    assert events[0] == events[1]
    tiers = {e["metrics"]["cosine_tier"] for e in events[0].values()}  # type: ignore[index]
    assert tiers == {"static", "minilm"}  # both tiers are in the comparison


def test_a_pair_on_the_bar_escalates_a_clear_one_does_not() -> None:
    """With the default escalation settings (the worker's)."""
    static, full = FakeEmbedder("static"), FakeEmbedder("minilm", scale=2.0)
    tiered = TieredScorer(static, full, IDENTITY, Escalation(sample_rate=0.0))
    clear = [pair(i, c) for i, c in enumerate([0.99, 0.97, 0.5, 0.2])]
    on_bar = pair(9, 0.88)
    found = tiered.cosines([*clear, on_bar])
    assert [c.tier for c in found] == ["static"] * 4 + ["minilm"]
    assert found[4].reason == "band"
    assert found[4].cosine == pytest.approx(0.76, abs=1e-5)  # the full model's cosine
    assert found[4].static == pytest.approx(0.88, abs=1e-5)


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


def test_band_pairs_the_draw_passes_over_are_counted() -> None:
    tiered, _, full = scorer(rate=0.0)
    found = tiered.cosines([pair(0, 0.88), pair(1, 0.90), pair(2, 0.86), pair(3, 0.99)])
    assert {c.tier for c in found} == {"static"} and full.calls == []
    assert tiered.agreement.summary()["passed_over"] == 3


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
    assert tiered.cosines([p])[0].cosine == 1.0 and full.calls == []


def test_failing_pairs_do_not_change_how_later_pairs_score() -> None:
    tiered, _, _ = scorer()
    before = tiered.score_pairs([pair(1, 0.99, "r/x")])[0]
    for i in range(10):
        assert tiered.score_pairs([pair(100 + i, 0.2, "r/x")])[0].cosine_tier == "static"
    assert tiered.score_pairs([pair(1, 0.99, "r/x")])[0] == before


def test_metrics_carry_tier_and_mapped_cosine() -> None:
    cal = Calibration(knots_x=(0.0, 1.0), knots_y=(-0.5, 1.0), band=0.01)
    static, full = FakeEmbedder("static"), FakeEmbedder("minilm")
    tiered = TieredScorer(static, full, cal, Escalation(sample_rate=0.0, rate=None))
    m = score_with(tiered, [pair(0, 0.5), pair(1, 0.92)])
    assert m[0].cosine == pytest.approx(0.25, abs=1e-5) and m[0].cosine_tier == "static"
    # 0.92 maps to 0.88: in the band, so the full model's cosine is used.
    assert m[1].cosine == pytest.approx(0.92, abs=1e-5) and m[1].cosine_tier == "minilm"


def test_static_only_never_calls_a_full_model() -> None:
    static = FakeEmbedder("static")
    tiered = TieredScorer(static, None, IDENTITY, Escalation(sample_rate=1.0))
    m = score_with(tiered, [pair(0, 0.88)])
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
        tiered, _, _ = scorer(sample_rate=0.1, rate=0.05)
        runs.append([(m.cosine, m.cosine_tier) for m in tiered.score_pairs(pairs)])
    assert runs[0] == runs[1]


@pytest.mark.parametrize(
    "kw", [{"sample_rate": 1.5}, {"band": -0.1}, {"rate": -0.1}, {"rate": 2.0}, {"thresholds": ()}]
)
def test_escalation_refuses_bad_settings(kw) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError):
        Escalation(**kw)


def test_staging_then_finishing_gives_what_score_with_gives() -> None:
    """The worker's two lanes are the two halves of ``score_with``: the same metrics,
    whether the waiting pairs are finished together or a few at a time."""
    cosines = [0.99, 0.90, 0.50, 0.86, 0.97, 0.88]
    pairs = [pair(i, c, route=f"r/{i % 2}") for i, c in enumerate(cosines)]
    whole = score_with(scorer(full_scale=2.0)[0], pairs)
    tiered, _, full = scorer(full_scale=2.0)
    staged = tiered.stage(pairs)
    assert sorted(staged.ready) == [0, 2, 4] and staged.waiting == [1, 3, 5]
    assert full.calls == []  # staging never touches the full model
    for i, m in staged.ready.items():
        assert m == whole[i]
    chunked = [tiered.finish_pairs([(staged, i)])[0] for i in staged.waiting]
    assert chunked == [whole[i] for i in staged.waiting]
    assert len(full.calls) == 3  # one call per chunk of one
    assert tiered.finish(staged) == {i: whole[i] for i in staged.waiting}
