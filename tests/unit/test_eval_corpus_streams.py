"""The corpus evaluation's streams, counted apart from the code that builds them.

No replay (each evaluation prompt at most once a stream), a mix shift (a weighted tag's
share goes up by about its weight), a slice-confined drift (the slice at its share of
the stream, the drift on the slice only), and a calibration that never shares a prompt
with the streams.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from quantdrift.evaluation.corpus import (
    CorpusPrompt,
    Scenario,
    by_prompt,
    confined_order,
    prompt_of,
    split,
    weighted_order,
)
from quantdrift.schemas import PairEvent
from quantdrift.schemas.pair import ModelOutput


def _prompts(n: int, seed: int = 0) -> list[CorpusPrompt]:
    rng = np.random.default_rng(seed)
    langs = ["en", "es", "zh", "ja"]
    tasks = ["code", "qa", "json", "chat"]
    return [
        CorpusPrompt(
            f"c0-{i:05d}",
            {"language": langs[int(rng.integers(4))], "task": tasks[int(rng.integers(4))]},
            None,
            {},
        )
        for i in range(n)
    ]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_healthy_stream_draws_each_evaluation_prompt_exactly_once(seed: int) -> None:
    prompts = _prompts(500)
    order = Scenario("traffic mix").order(prompts, np.random.default_rng(seed))
    counts = Counter(order)
    assert len(order) == 500 and max(counts.values()) == 1
    assert set(order) == set(range(500))


def test_a_mix_shift_raises_the_weighted_tags_share_and_never_replays() -> None:
    prompts = _prompts(2000)
    base = sum(p.tags["task"] == "code" for p in prompts) / len(prompts)
    shares = []
    for seed in range(20):
        scenario = Scenario("mix", weights={("task", "code"): 3.0})
        order = scenario.order(prompts, np.random.default_rng(seed))
        assert len(order) == len(set(order)) == 1000  # half the prompts, none twice
        shares.append(sum(prompts[i].tags["task"] == "code" for i in order) / len(order))
    # Drawn without replacement from a finite pool, a x3 weight cannot triple the share,
    # but it must move it well above the calibration's mix (about 25 %).
    assert np.mean(shares) > base + 0.12, (base, np.mean(shares))


def test_weighted_order_never_draws_a_zero_weight() -> None:
    order = weighted_order([0.0, 1.0, 2.0, 0.0, 1.0], 5, np.random.default_rng(0))
    assert sorted(order) == [1, 2, 4]


@pytest.mark.parametrize("share", [0.05, 0.1, 0.3])
def test_a_confined_drift_holds_its_slice_at_the_share(share: float) -> None:
    prompts = _prompts(2000)
    in_slice = [p.tags["language"] == "zh" for p in prompts]
    order = confined_order(in_slice, share, np.random.default_rng(3))
    assert len(order) == len(set(order))
    got = sum(in_slice[i] for i in order) / len(order)
    assert abs(got - share) < 0.01, got
    scenario = Scenario("c", confine=("language", "zh"), share=share)
    assert all(scenario.drifts(prompts[i]) == in_slice[i] for i in order)


def test_a_confined_slice_too_small_keeps_all_of_it_and_fewer_others() -> None:
    in_slice = [i < 10 for i in range(1000)]
    order = confined_order(in_slice, 0.5, np.random.default_rng(0))
    inside = sum(in_slice[i] for i in order)
    assert inside == 10 and len(order) == 20


def test_an_only_scenario_keeps_the_slice_alone() -> None:
    prompts = _prompts(400)
    order = Scenario("s", only=("language", "ja")).order(prompts, np.random.default_rng(0))
    assert order and all(prompts[i].tags["language"] == "ja" for i in order)
    assert len(order) == sum(p.tags["language"] == "ja" for p in prompts)


def test_calibration_and_evaluation_pools_never_share_a_prompt() -> None:
    ids = [f"c0-{i:05d}" for i in range(1000)]
    for seed in range(5):
        cal, ev = split(ids, 300, seed)
        assert len(cal) == 300 and len(ev) == 700 and not set(cal) & set(ev)
        assert sorted(cal + ev) == sorted(ids)


def test_pairs_group_by_their_prompt_whatever_the_label() -> None:
    def pair(pid: str, kind: str, label: str) -> PairEvent:
        side = ModelOutput(text="a")
        return PairEvent(
            pair_id=pid, ts=0, route="r", kind=kind, candidate=side, reference=side, label=label,
            tags={"language": "zh"},
        )  # fmt: skip

    pairs = [
        pair("c0-00001-noise", "noise", "noise"),
        pair("c0-00001-int4-g64-gptq", "shadow", "int4-g64-gptq"),
        pair("c0-00001-int8", "shadow", "int8"),
        pair("c0-00002-int8", "shadow", "int8"),
    ]
    assert [prompt_of(p) for p in pairs] == ["c0-00001"] * 3 + ["c0-00002"]
    grouped = by_prompt(pairs)
    assert set(grouped["c0-00001"].shadow) == {"int4-g64-gptq", "int8"}
    assert grouped["c0-00001"].noise is not None and grouped["c0-00002"].noise is None
    assert grouped["c0-00001"].tags == {"language": "zh"}
