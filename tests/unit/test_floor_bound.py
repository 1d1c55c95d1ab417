"""The divergence floor's upper bound: the worst prompt mix within the ratio, then a t bound."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from quantdrift.detectors.tolerance import mix_robust_upper, student_t_quantile


@pytest.mark.parametrize("df", [1, 2, 3, 4, 9, 20, 39, 511])
@pytest.mark.parametrize("p", [0.5, 0.9, 0.975, 0.99])
def test_t_quantile_matches_scipy(df: int, p: float) -> None:
    assert student_t_quantile(p, df) == pytest.approx(stats.t.ppf(p, df), abs=1e-7)


def test_the_bound_covers_every_reweighting_of_the_sample_within_the_ratio() -> None:
    # The sample's worst reweighting (weights within [1 / r, r] up to a common scale)
    # is at most the bound's mix part: random reweightings never exceed the bound.
    rng = np.random.default_rng(3)
    values = rng.beta(2.0, 12.0, size=40)
    ratio = 1.25
    bound = mix_robust_upper(values.tolist(), ratio=ratio, alpha=0.5)  # t quantile 0
    for _ in range(200):
        w = np.where(rng.random(40) < 0.5, 1 / ratio, ratio) * rng.uniform(0.999, 1.0, 40)
        assert float(np.sum(w * values) / np.sum(w)) <= bound + 1e-12


def test_the_bound_grows_with_the_mix_ratio_and_the_confidence() -> None:
    values = np.random.default_rng(4).beta(2.0, 12.0, size=40).tolist()
    plain = float(np.mean(values))
    assert mix_robust_upper(values, ratio=1.0, alpha=0.5) == pytest.approx(plain)
    a = mix_robust_upper(values, ratio=1.25, alpha=0.025)
    assert plain < mix_robust_upper(values, ratio=1.25, alpha=0.5) < a
    assert a < mix_robust_upper(values, ratio=1.5, alpha=0.025)
    assert a < mix_robust_upper(values, ratio=1.25, alpha=0.01)


def test_a_floor_without_spread_is_its_value() -> None:
    assert mix_robust_upper([0.2] * 30) == pytest.approx(0.2)


@pytest.mark.parametrize("bad", [{"ratio": 0.9}, {"alpha": 0.6}])
def test_nonsense_parameters_are_refused(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        mix_robust_upper([0.1, 0.2], **bad)
