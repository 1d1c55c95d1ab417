"""Every module's doctests, collected from the source tree rather than a hand-kept list.

A new module's examples run without anyone adding it here. Modules that need a heavy
optional dependency (torch, from the ``lab`` extra) still run in ``make test``; they are
marked ``slow`` so the fast tier stays fast, each with its reason below.
"""

from __future__ import annotations

import doctest
import importlib
from pathlib import Path

import pytest

import quantdrift

ROOT = Path(quantdrift.__file__).resolve().parent

# module -> why it is left out of the fast tier (it still runs in ``make test``).
HEAVY = {
    "quantdrift.lab.quant": "imports torch (the lab extra) to quantize weights",
    "quantdrift.lab.generate": "imports torch (the lab extra) to run the model",
    "quantdrift.lab.server": "imports lab.generate, hence torch",
    "quantdrift.cli.lab": "imports the lab's torch modules at load",
}
# module -> why it is not imported at all.
NOT_IMPORTED = {
    "quantdrift.__main__": "runs the command line when imported; it holds no examples",
    "quantdrift.integrations.litellm": (
        "imports litellm, which lives in the proxy's own venv (make litellm); it holds no "
        "examples, and tests/integration/test_litellm.py runs it inside the real proxy"
    ),
}


def module_names() -> list[str]:
    """Every module under ``src/quantdrift``, by dotted name, sorted."""
    names = []
    for path in sorted(ROOT.rglob("*.py")):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names.append(".".join(parts))
    return names


def params() -> list[object]:
    return [
        pytest.param(name, marks=[pytest.mark.slow] if name in HEAVY else [])
        for name in module_names()
        if name not in NOT_IMPORTED
    ]


def test_the_exception_lists_name_real_modules() -> None:
    names = set(module_names())
    assert set(HEAVY) <= names and set(NOT_IMPORTED) <= names


@pytest.mark.parametrize("name", params())
def test_doctests(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0, f"{name}: {result.failed} of {result.attempted} examples failed"
