"""The command line as a user runs it: ``python -m quantdrift`` in its own process.

One runner for every test that drives the CLI, so each reads the same way: what a
user types, where, with which environment.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path


def user_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment without its QUANTDRIFT_ variables, plus ``extra``: a
    user's shell, so a setting the test runner happens to carry cannot leak in."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("QUANTDRIFT_")}
    return {**base, **(extra or {})}


def quantdrift(
    *argv: str, cwd: Path, env: Mapping[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """``quantdrift ARGV`` in ``cwd``; ``env`` is the whole environment (None: ``user_env()``)."""
    return subprocess.run(
        [sys.executable, "-m", "quantdrift", *argv],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=dict(env) if env is not None else user_env(),
        timeout=timeout,
    )
