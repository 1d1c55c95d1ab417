"""Entropy, KL, flip rate and teacher-forced gap on small hand-worked inputs."""

from __future__ import annotations

import math

import numpy as np
import pytest

from quantdrift.detectors import entropy
from quantdrift.schemas import ModelOutput

LN2 = math.log(2)
L = math.log


@pytest.mark.parametrize(
    ("top", "expected"),
    [
        ([{"a": 0.0}], [0.0]),
        ([{"a": L(0.5), "b": L(0.5)}], [LN2]),
        # Renormalized: 0.2 and 0.2 listed (0.6 unlisted) -> a fair coin -> ln 2.
        ([{"a": L(0.2), "b": L(0.2)}], [LN2]),
        # Four equal -> ln 4; ragged widths are padded, empty positions skipped.
        ([{"a": L(0.25), "b": L(0.25), "c": L(0.25), "d": L(0.25)}, {}, {"x": 0.0}], [L(4), 0.0]),
        # p = (0.9, 0.1): H = -(0.9 ln 0.9 + 0.1 ln 0.1) = 0.0948 + 0.2303 = 0.3251
        ([{"a": L(0.9), "b": L(0.1)}], [-(0.9 * L(0.9) + 0.1 * L(0.1))]),
    ],
)
def test_entropy_from_top_logprobs(top: list[dict[str, float]], expected: list[float]) -> None:
    np.testing.assert_allclose(entropy.entropy_from_top_logprobs(top), expected, atol=1e-12)


def test_token_entropies_prefers_the_entropy_field() -> None:
    out = ModelOutput(text="x", entropy=[0.3, 0.1], top_logprobs=[{"a": 0.0}, {"a": 0.0}])
    np.testing.assert_allclose(entropy.token_entropies(out), [0.3, 0.1])
    out = ModelOutput(text="x", top_logprobs=[{"a": L(0.5), "b": L(0.5)}])
    np.testing.assert_allclose(entropy.token_entropies(out), [LN2])
    assert entropy.token_entropies(ModelOutput(text="x")) is None
    assert entropy.token_entropies(ModelOutput(text="x", top_logprobs=[{}])) is None


def test_entropy_stats_and_shift() -> None:
    assert entropy.entropy_stats(None) == (None, None)
    assert entropy.entropy_stats(np.array([0.2, 0.4])) == pytest.approx((0.3, 0.2))
    assert entropy.entropy_shift(0.5, 0.2) == pytest.approx(0.3)
    assert entropy.entropy_shift(None, 0.2) is None


def test_kl_identical_is_zero_and_no_flips() -> None:
    top = [{"a": L(0.7), "b": L(0.2)}, {"c": L(0.6), "d": L(0.3)}]
    kl, flips = entropy.kl_and_flip_rate(top, top)
    assert kl == pytest.approx(0.0, abs=1e-12)
    assert flips == 0.0


def test_kl_same_support_by_hand() -> None:
    # P = (0.5, 0.5), Q = (0.75, 0.25), same support, full mass:
    # KL = 0.5 ln(0.5/0.75) + 0.5 ln(0.5/0.25) = 0.5 (ln 2/3 + ln 2) = 0.5 ln(4/3) = 0.1438
    kl, flips = entropy.kl_and_flip_rate(
        [{"a": L(0.5), "b": L(0.5)}], [{"a": L(0.75), "b": L(0.25)}]
    )
    assert kl == pytest.approx(0.5 * math.log(4 / 3), abs=1e-12)
    # argmax of P is a tie (first listed, "a") and of Q is "a": no flip.
    assert flips == 0.0


def test_kl_union_support_with_missing_mass_floor() -> None:
    # P lists a: 0.6, b: 0.3 (0.1 unlisted); Q lists a: 0.6, c: 0.3 (0.1 unlisted).
    # Support {a, b, c}: P's floor for c = min(0.1 / 1, 0.3) = 0.1 -> P = (0.6, 0.3, 0.1);
    # Q's floor for b = 0.1 -> Q = (0.6, 0.1, 0.3), both sum to 1 already.
    # KL = 0.3 ln(0.3/0.1) + 0.1 ln(0.1/0.3) = 0.2 ln 3 = 0.2197
    kl, flips = entropy.kl_and_flip_rate([{"a": L(0.6), "b": L(0.3)}], [{"a": L(0.6), "c": L(0.3)}])
    assert kl == pytest.approx(0.2 * math.log(3), abs=1e-12)
    assert flips == 0.0


def test_kl_disjoint_certain_tokens_uses_the_floor() -> None:
    # P = {x: 1}, Q = {y: 1}; no missing mass -> floor entropy.PROB_FLOOR on both sides.
    kl, flips = entropy.kl_and_flip_rate([{"x": 0.0}], [{"y": 0.0}])
    a, b = 1 / (1 + entropy.PROB_FLOOR), entropy.PROB_FLOOR / (1 + entropy.PROB_FLOOR)
    assert kl == pytest.approx((a - b) * math.log(a / b), rel=1e-9)
    assert flips == 1.0


def test_flip_rate_over_aligned_positions_only() -> None:
    ref = [{"a": 0.0}, {"b": L(0.9), "c": L(0.1)}, {}, {"d": 0.0}, {"e": 0.0}]
    cand = [{"a": 0.0}, {"c": L(0.9), "b": L(0.1)}, {"z": 0.0}, {"q": 0.0}]
    # Aligned: positions 0, 1, 3 (2 is empty on the reference, 4 missing on the
    # candidate); flips at 1 and 3 -> 2/3.
    _, flips = entropy.kl_and_flip_rate(ref, cand)
    assert flips == pytest.approx(2 / 3)


@pytest.mark.parametrize(
    ("ref", "cand"), [(None, [{"a": 0.0}]), ([{"a": 0.0}], None), ([{}], [{}])]
)
def test_kl_unknown(
    ref: list[dict[str, float]] | None, cand: list[dict[str, float]] | None
) -> None:
    assert entropy.kl_and_flip_rate(ref, cand) == (None, None)


@pytest.mark.parametrize(
    ("own", "cross", "expected"),
    [
        ([-0.5, -0.5], [-1.0, -2.0], 1.0),  # -0.5 - (-1.5)
        ([-1.0], [-1.0, -1.0, -1.0], 0.0),
        ([-2.0, -1.0], [-0.5], -1.0),  # candidate MORE likely: negative gap
        (None, [-1.0], None),
        ([-1.0], None, None),
        ([], [-1.0], None),
    ],
)
def test_teacher_forced_gap(
    own: list[float] | None, cross: list[float] | None, expected: float | None
) -> None:
    assert entropy.teacher_forced_gap(own, cross) == expected
