"""bench/niah_table.py: a row per (language, length) cell, a column per build, a cell
the launch would veto marked by the launch's own judgement, a cell a build did not run
shown as such, and a bad engine argument refused."""

from __future__ import annotations

import argparse

import niah_table
import pytest


def cell(lang: str, n: int, cand: float, ref: float) -> dict[str, object]:
    return {"language": lang, "length": n, "candidate": cand, "reference": ref,
            "prompt_tokens": n + 24}  # fmt: skip


def test_cells_by_length_then_language_with_the_launch_s_vetoes() -> None:
    cells = {
        "int8": [cell("zh", 1024, 0.75, 0.75), cell("en", 1024, 1.0, 1.0), cell("en", 256, 1, 1)],
        "int3": [cell("en", 256, 0.25, 1.0), cell("zh", 1024, 0.5, 0.75)],
    }
    vetoed = {
        b: {(c["language"], c["length"]) for c in cs if not niah_table._passes(c, 0.5, 0.25)}
        for b, cs in cells.items()
    }
    assert vetoed == {"int8": set(), "int3": {("en", 256)}}
    lines = niah_table.table(cells, vetoed).splitlines()
    assert lines[0] == "| cell | prompt tokens | int8 | int3 |"
    assert lines[2:] == [
        "| en, 256 | 280 | 100 % / 100 % | 25 % / 100 % VETO |",
        "| en, 1,024 | 1048 | 100 % / 100 % | – |",
        "| zh, 1,024 | 1048 | 75 % / 75 % | 50 % / 75 % |",
    ]


def test_an_engine_is_name_equals_url() -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="NAME=URL"):
        niah_table.engine("http://127.0.0.1:8000")
