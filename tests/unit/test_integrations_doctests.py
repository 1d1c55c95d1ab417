"""The integrations modules' doctests (pytest collects doctests under detectors/ only)."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = [
    "quantdrift.integrations.litellm_pairs",
    "quantdrift.otel",
    "quantdrift.schemas.pair",
]


@pytest.mark.parametrize("name", MODULES)
def test_doctests(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0, f"{name}: no examples found"
    assert result.failed == 0, f"{name}: {result.failed} of {result.attempted} examples failed"
