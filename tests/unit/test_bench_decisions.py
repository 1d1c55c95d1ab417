"""bench/decisions.py: the tiered-vs-MiniLM rule, and a small run's JSON and section on
the first recorded corpus block (three scorers, one mode, one calibration draw)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import decisions  # bench/ is not a package
import pytest

from quantdrift.evaluation.corpus import by_prompt, complete, split
from quantdrift.services.pairs import read_pairs

BLOCK = Path(__file__).resolve().parents[2] / "corpus" / "pairs" / "block-00000.jsonl.xz"


def scorer(fr: int, **delays: tuple[float | None, float | None, int]) -> dict[str, Any]:
    return {
        "false_rollbacks": fr,
        "delay": {v: {"median": m, "p90": p, "missed": k} for v, (m, p, k) in delays.items()},
    }


MINILM = scorer(0, int4=(20.0, 30.0, 0), int2=(None, 201.0, 2))


@pytest.mark.parametrize(
    ("tiered", "within", "zero"),
    [
        (scorer(0, int4=(20.0, 30.0, 0), int2=(None, 201.0, 2)), True, True),
        (scorer(0, int4=(22.0, 27.0, 0), int2=(None, 201.0, 2)), True, True),  # 10 % both ways
        (scorer(0, int4=(23.0, 30.0, 0), int2=(None, 201.0, 2)), False, True),  # 15 % slower
        (scorer(0, int4=(17.0, 30.0, 0), int2=(None, 201.0, 2)), False, True),  # 15 % faster
        (scorer(0, int4=(20.0, 30.0, 0), int2=(None, 201.0, 1)), False, True),  # other misses
        (scorer(0, int4=(20.0, 30.0, 0), int2=(40.0, 201.0, 2)), False, True),  # only one calls
        (scorer(1, int4=(20.0, 30.0, 0), int2=(None, 201.0, 2)), True, False),
    ],
)
def test_tiered_is_equivalent_only_within_ten_percent_and_without_false_rollbacks(
    tiered: dict[str, Any], within: bool, zero: bool
) -> None:
    got = decisions.compare(tiered, MINILM)
    assert (got["within_10pct"], got["zero_false_rollbacks"]) == (within, zero)
    assert got["equivalent"] is (within and zero)
    assert set(got["delay_ratio"]) == {"int4", "int2"}


@pytest.mark.slow  # loads MiniLM: CI's `make test` runs it, `make test-fast` leaves it out
def test_a_small_run_gives_the_json_and_the_section(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "pairs"
    folder.mkdir()
    shutil.copy(BLOCK, folder / BLOCK.name)
    out = tmp_path / "BENCHMARKS.md"
    argv = ["--corpus", str(folder), "--draws", "1", "--calibration", "6"]
    argv += ["--modes", "greedy/none", "--embedders", "minilm,tiered,tiered-bf16"]
    assert decisions.main([*argv, "--json", "--write", str(out)]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    # Counted apart from the bench: the block's complete prompts, the pool cut as the
    # corpus evaluation cuts it, and the greedy ones left for the stream, each once.
    grouped = by_prompt(read_pairs(folder))
    full = complete(grouped, ["int8", *decisions.VARIANTS])
    pool = len(full) // 3  # a block spares none of the sizes: the largest third it can
    _, evaluation = split(full, pool, seed=0)
    greedy = [pid for pid in evaluation if grouped[pid].tags["decoding"] == "greedy"]
    assert 0 < len(greedy) < len(evaluation)
    mode = result["modes"]["greedy/none"]
    for name in ("minilm", "tiered", "tiered-bf16"):
        assert mode[name]["healthy_pairs"] == len(greedy)
        assert set(mode[name]["delay"]) == set(decisions.VARIANTS)
        assert isinstance(mode[name]["false_rollbacks"], int)
    comparison = mode["tiered_vs_minilm"]
    assert comparison == decisions.compare(mode["tiered"], mode["minilm"])
    assert result["tiered_equivalent_everywhere"] is comparison["equivalent"]
    bf16 = mode["tiered-bf16_vs_minilm"]
    assert bf16 == decisions.compare(mode["tiered-bf16"], mode["minilm"])
    assert result["equivalent_everywhere"] == {
        "tiered": comparison["equivalent"],
        "tiered-bf16": bf16["equivalent"],
    }
    assert result["size"] == {
        "complete_prompts": len(full),
        "calibration_pool": pool,
        "calibration_prompts": 6,
        "distinct_eval_prompts": len(evaluation),
        "draws": 1,
        "seed": 0,
    }
    section = out.read_text()
    assert decisions.SECTION in section and "| greedy/none | tiered |" in section
    assert "| greedy/none | tiered-bf16 |" in section
    assert f"apart from the {len(evaluation)} evaluation prompts" in section
