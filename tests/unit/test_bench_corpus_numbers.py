"""bench/corpus_numbers.py on the first recorded block: its counts match a count made
here from the block's raw lines, not through the bench's own reading of them."""

from __future__ import annotations

import json
import lzma
import shutil
from collections import Counter
from pathlib import Path

import corpus_numbers  # bench/ is not a package
import pytest

BLOCK = Path(__file__).resolve().parents[2] / "corpus" / "pairs" / "block-00000.jsonl.xz"

pytestmark = pytest.mark.unit


def test_the_counts_match_the_block_line_by_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "pairs"
    folder.mkdir()
    shutil.copy(BLOCK, folder / BLOCK.name)
    with lzma.open(BLOCK, "rt", encoding="utf-8") as f:
        lines = [json.loads(line) for line in f if line.strip()]
    noise = [p for p in lines if p["kind"] == "noise"]
    shadow = [p for p in lines if p["kind"] == "shadow"]
    generated = Counter()
    for p in shadow:
        generated[p["label"]] += len(p["candidate"].get("tokens") or [])
    assert corpus_numbers.main(["--corpus", str(folder), "--prompts", str(tmp_path / "none"),
                                "--json"]) == 0  # fmt: skip
    got = json.loads(capsys.readouterr().out)
    assert got["prompts"] == len(noise) == 25
    assert got["pairs"] == len(lines)
    assert got["shadow_pairs"] == len(shadow)
    assert got["teacher_forced"] == sum(
        1 for p in shadow if p.get("reference_logprobs_on_candidate") is not None
    )
    assert got["language"] == dict(Counter(p["tags"]["language"] for p in noise).most_common())
    assert sum(got["task"].values()) == 25
    for label, n in generated.items():
        assert got["engines"][label]["generated_tokens"] == n
        assert got["engines"][label]["requests"] == len(noise)
    assert got["engines"]["ref"]["requests"] == 2 * len(noise)
