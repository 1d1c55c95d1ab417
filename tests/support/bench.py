"""Running a bench script the way its docs are regenerated: ``--json --write DOC``."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest


def write_section(
    main: Callable[[list[str]], int],
    heading: str,
    argv: list[str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> tuple[dict[str, Any], str]:
    """Run ``main(argv + --json --write doc)`` over a doc whose section ``heading`` holds
    old text: (the JSON it printed, the doc after). The section must be replaced and
    the next one kept."""
    out = tmp_path / "doc.md"
    out.write_text(f"# Doc\n\n## {heading}\n\nold\n\n## Next\n\nkept\n")
    assert main([*argv, "--json", "--write", str(out)]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    text = out.read_text()
    assert "old" not in text and "## Next\n\nkept" in text
    return result, text


def rows_by_signal(result: dict[str, Any], name: str = "lab") -> dict[tuple[str, str], Any]:
    """A set's rows keyed by (decoding, signal)."""
    return {(r["decoding"], r["signal"]): r for r in result["sets"][name]}
