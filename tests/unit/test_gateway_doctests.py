"""The gateway modules' doctests (pytest collects doctests under detectors/ only)."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = [
    "quantdrift.gateway.auth",
    "quantdrift.gateway.capacity",
    "quantdrift.gateway.completions",
    "quantdrift.gateway.degeneration",
    "quantdrift.gateway.openai_wire",
    "quantdrift.gateway.planning",
    "quantdrift.gateway.routing",
    "quantdrift.gateway.sampling",
    "quantdrift.gateway.shadow",
    "quantdrift.gateway.targets",
    "quantdrift.gateway.teacher_forcing",
    "quantdrift.status.page",
]


@pytest.mark.parametrize("name", MODULES)
def test_doctests(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0, f"{name}: {result.failed} of {result.attempted} examples failed"
