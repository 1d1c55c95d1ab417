"""``quantdrift --help`` and ``--version`` load nothing heavy, through the real entry point.

A wall-clock bound would be flaky on a shared machine; what makes help slow is
importing torch, transformers, faust and friends, so that is what is asserted:
a fresh interpreter runs the console entry point (``quantdrift.cli:main``) and
then reports every module it loaded (``-X importtime`` would miss the modules
loaded through importlib, which is how commands are registered).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from quantdrift import __version__
from quantdrift.cli import COMMANDS

HEAVY = (
    "torch",
    "transformers",
    "sentence_transformers",
    "faust",
    "aiokafka",
    "fastapi",
    "uvicorn",
    "redis",
    "numpy",
    "pydantic_settings",
)


PROBE = """
import json, sys
from quantdrift.cli import main
try:
    code = main(sys.argv[1:])
except SystemExit as exc:
    code = exc.code
sys.stderr.write("MODULES " + json.dumps(sorted(sys.modules)) + "\\n")
sys.exit(code)
"""


def _imported(*argv: str) -> tuple[subprocess.CompletedProcess[str], set[str]]:
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, *argv], capture_output=True, text=True, timeout=120
    )
    line = next(ln for ln in proc.stderr.splitlines() if ln.startswith("MODULES "))
    return proc, set(json.loads(line.removeprefix("MODULES ")))


def _heavy(modules: set[str]) -> list[str]:
    return sorted(m for m in modules if m.split(".")[0] in HEAVY)


def test_help_imports_nothing_heavy() -> None:
    """The registry is lazy: ``--help`` lists every command and imports none of them."""
    proc, modules = _imported("--help")
    assert proc.returncode == 0
    assert "quantdrift.cli" in modules  # the log is real: the entry point ran
    assert {m for m in modules if m.startswith("quantdrift.cli.")} == {"quantdrift.cli.exits"}
    assert all(name in proc.stdout for name in COMMANDS)
    assert _heavy(modules) == []
    assert "usage: quantdrift" in proc.stdout
    assert "``" not in proc.stdout  # no raw reStructuredText markup


@pytest.mark.parametrize("command", list(COMMANDS))
def test_command_help_imports_nothing_heavy(command: str) -> None:
    """Each command's flags register the name the registry gives it, and its help
    loads those flags and nothing the command runs, nor any other command's modules."""
    proc, modules = _imported(command, "--help")
    assert proc.returncode == 0, proc.stderr[-500:]
    assert COMMANDS[command].parser in modules
    assert COMMANDS[command].runner not in modules
    others = {m for name, c in COMMANDS.items() if name != command for m in (c.parser, c.runner)}
    assert not others & modules
    assert "quantdrift.cli.settings" not in modules
    assert _heavy(modules) == []
    assert "``" not in proc.stdout


def test_version() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "quantdrift", "--version"], capture_output=True, text=True
    )
    assert (proc.returncode, proc.stdout.strip()) == (0, f"quantdrift {__version__}")
