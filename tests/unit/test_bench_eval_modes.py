"""bench/eval_modes.py on the lab pairs, small: the section says from how many distinct
int8 pairs the healthy streams were drawn (a few seconds of CPU with the static embedder)."""

from __future__ import annotations

import json
from pathlib import Path

import eval_modes  # bench/ is not a package
import pytest

from quantdrift.evaluation.modes import select
from quantdrift.services.pairs import read_pairs


@pytest.mark.slow  # scores the lab set: CI's `make test` runs it, `make test-fast` does not
def test_the_section_names_the_distinct_pairs_behind_each_mode(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "doc.md"
    out.write_text(f"# Doc\n\n{eval_modes.SECTION}\n\nold\n\n## Next\n\nkept\n")
    argv = ["--streams", "2", "--length", "300", "--calibration-draws", "2", "--sets", "lab"]
    argv += ["--embedder", "static", "--json", "--write", str(out)]
    assert eval_modes.main(argv) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    path, _ = eval_modes.SETS["lab"]
    pairs = read_pairs(path)
    text = out.read_text()
    for decoding in ("greedy", "sampled"):
        # Counted apart from the eval: the int8 shadow pairs of the evaluation prompts.
        held_out = select(pairs, labels=("int8",), decoding=decoding, part="evaluation")  # type: ignore[arg-type]
        expected = len([p for p in held_out if p.kind == "shadow"])
        assert 0 < expected < 300  # streams of 300 pairs must repeat them
        for logprobs in ("teacher-forced", "logprobs", "text only"):
            mode = f"{decoding}, {logprobs}"
            assert result["sets"]["lab"][mode]["distinct_healthy"] == expected
            assert f"| lab | {mode} | {expected} | " in text
    assert "old" not in text and "## Next\n\nkept" in text
