"""`quantdrift eval --no-replay` on the first recorded block of the traffic corpus.

The pairs are the recorder's own (corpus/pairs/block-00000.jsonl.xz, recorded on vLLM):
no pair is hand-built. What the streams contain is counted here from the file, apart
from the code under test: the complete prompts, the calibration pool cut from them, and
so the healthy pairs a run of D draws must have judged (each evaluation prompt once a
stream).
"""

from __future__ import annotations

import json
import lzma
import shutil
from collections import defaultdict
from pathlib import Path

import pytest

from quantdrift.cli import main

BLOCK = Path(__file__).resolve().parents[2] / "corpus" / "pairs" / "block-00000.jsonl.xz"
LABELS = ("noise", "int8", "int4-g64-gptq", "int3-g64")


@pytest.fixture()
def corpus(tmp_path: Path) -> Path:
    folder = tmp_path / "pairs"
    folder.mkdir()
    shutil.copy(BLOCK, folder / BLOCK.name)
    return folder


def complete_prompts() -> set[str]:
    labels: dict[str, set[str]] = defaultdict(set)
    with lzma.open(BLOCK, "rt", encoding="utf-8") as f:
        for line in f:
            pair = json.loads(line)
            labels[pair["pair_id"][: -len(pair["label"]) - 1]].add(pair["label"])
    return {pid for pid, got in labels.items() if set(LABELS) <= got}


def run(capsys: pytest.CaptureFixture[str], *args: str) -> list[dict[str, object]]:
    assert main(["eval", "--no-replay", "--embedder", "static", "--no-progress", *args]) == 0
    return json.loads(capsys.readouterr().out)


def test_no_replay_streams_judge_each_evaluation_prompt_once_per_draw(
    corpus: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    complete = complete_prompts()
    assert len(complete) >= 20, "the first block holds complete prompts"
    rows = run(
        capsys,
        "--healthy", str(corpus), "--healthy-label", "int8",
        "--drifted-label", "int3-g64,int4-g64-gptq",
        "--calibration-prompts", "6", "--calibration-draws", "4", "--json",
    )  # fmt: skip
    assert [r["variant"] for r in rows] == ["-", "int3-g64", "int4-g64-gptq"]
    evaluation = len(complete) - 6
    for r in rows:
        assert r["distinct_eval_prompts"] == evaluation
        assert r["healthy_pairs"] == 4 * evaluation  # each prompt once a stream, 4 streams
        assert r["streams"] == 4 and r["calibration_prompts"] == 6
    for r in rows[1:]:
        assert r["missed"] <= 4
        assert r["delay_p90"] is not None


def test_a_mix_shift_streams_half_the_prompts_and_a_confined_drift_keeps_its_share(
    corpus: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    complete = complete_prompts()
    evaluation = len(complete) - 6
    rows = run(
        capsys,
        "--healthy", str(corpus), "--healthy-label", "int8", "--drifted-label", "int3-g64",
        "--calibration-prompts", "6", "--calibration-draws", "2",
        "--mix", "language=en:3", "--json",
    )  # fmt: skip
    assert rows[0]["scenario"] == "mix language=en x3"
    assert rows[0]["healthy_pairs"] == 2 * (evaluation // 2)


def test_bad_corpus_options_are_one_line_errors(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["eval", "--no-replay", "--healthy", "x", "--mix", "language=en"])
    assert exc.value.code == 2
    assert "DIM=VALUE:WEIGHT" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["eval", "--no-replay", "--healthy", "x", "--confine-share", "1.5"])
    assert "a share in (0, 1)" in capsys.readouterr().err
