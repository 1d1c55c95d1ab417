"""Deterministic sampling: stable per key, converging to the rate, reproducible elsewhere."""

from __future__ import annotations

import hashlib
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quantdrift.gateway.chain.sampling import bucket, sampled

rates = st.floats(min_value=0.0, max_value=1.0, allow_nan=False)
keys = st.text(max_size=64)
salts = st.text(max_size=16)


@given(key=keys, rate=rates, salt=salts)
def test_same_key_same_answer(key: str, rate: float, salt: str) -> None:
    assert sampled(key, rate, salt) == sampled(key, rate, salt)


@given(key=keys, salt=salts)
def test_rate_zero_never_one_always(key: str, salt: str) -> None:
    assert sampled(key, 0.0, salt) is False
    assert sampled(key, 1.0, salt) is True


@given(key=keys, low=rates, high=rates, salt=salts)
def test_raising_the_rate_only_adds_keys(key: str, low: float, high: float, salt: str) -> None:
    low, high = min(low, high), max(low, high)
    if sampled(key, low, salt):
        assert sampled(key, high, salt)


@settings(max_examples=40, deadline=None)
@given(rate=rates, salt=salts)
def test_fraction_converges_to_rate(rate: float, salt: str) -> None:
    n = 5_000
    hits = sum(sampled(f"req-{i}", rate, salt) for i in range(n))
    # Five standard errors: a deterministic hash must not fail this by chance.
    tolerance = 5 * math.sqrt(rate * (1 - rate) / n) + 1e-12
    assert abs(hits / n - rate) <= tolerance


@given(key=keys, salt=salts)
def test_bucket_in_unit_interval(key: str, salt: str) -> None:
    assert 0.0 <= bucket(key, salt) < 1.0


@pytest.mark.parametrize("key, salt", [("req-1", ""), ("pair-42", "cs-agent"), ("请求", "s")])
def test_bucket_matches_the_documented_recipe(key: str, salt: str) -> None:
    """What a gateway in another language computes: sha1(salt+key), top 53 bits."""
    top64 = int(hashlib.sha1((salt + key).encode()).hexdigest()[:16], 16)
    assert bucket(key, salt) == (top64 >> 11) / 2**53


def test_salt_changes_the_sample() -> None:
    a = {i for i in range(2_000) if sampled(str(i), 0.5, "a")}
    b = {i for i in range(2_000) if sampled(str(i), 0.5, "b")}
    assert a != b


@pytest.mark.parametrize("rate", [-0.1, 1.5, math.nan, math.inf])
def test_bad_rate_is_refused(rate: float) -> None:
    with pytest.raises(ValueError):
        sampled("k", rate)
