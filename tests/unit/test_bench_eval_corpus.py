"""bench/eval_corpus.py on the first recorded block, small: one JSON document with the
documented keys, one row per scenario x variant x calibration size x mode, and the
evaluation prompts counted apart from the bench (complete prompts less the pool)."""

from __future__ import annotations

import json
import lzma
import shutil
from collections import defaultdict
from pathlib import Path

import eval_corpus  # bench/ is not a package
import pytest

BLOCK = Path(__file__).resolve().parents[2] / "corpus" / "pairs" / "block-00000.jsonl.xz"
ROW_KEYS = {
    "scenario",
    "variant",
    "calibration_prompts",
    "mode",
    "false_rollbacks",
    "healthy_pairs",
    "streams",
    "delay_p50",
    "delay_p90",
    "missed",
    "limit",
}


@pytest.mark.slow  # scores a block: CI's `make test` runs it, `make test-fast` does not
def test_one_document_with_every_scenario_row(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "pairs"
    folder.mkdir()
    shutil.copy(BLOCK, folder / BLOCK.name)
    labels: dict[str, set[str]] = defaultdict(set)
    with lzma.open(BLOCK, "rt", encoding="utf-8") as f:
        for line in f:
            p = json.loads(line)
            labels[p["pair_id"][: -len(p["label"]) - 1]].add(p["label"])
    need = {"noise", "int8", "int4-g64-gptq", "int3-g64"}
    complete = sum(1 for got in labels.values() if need <= got)
    argv = ["--corpus", str(folder), "--draws", "2", "--sizes", "6", "--modes", "full,none"]
    argv += ["--no-slices", "--embedder", "static", "--json"]
    assert eval_corpus.main(argv) == 0
    doc = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert doc["distinct_eval_prompts"] == complete - 6
    assert doc["calibration_prompts"] == [6]
    rows = doc["rows"]
    assert all(set(r) >= ROW_KEYS for r in rows)
    scenarios = {r["scenario"] for r in rows}
    assert scenarios == {
        "traffic mix",
        "mix task=json_extraction x3",
        "mix language=ja x3",
        "confined language=zh @10%",
        "confined length=long @10%",
    }
    assert {r["mode"] for r in rows} == {"teacher-forced", "text only"}
    # Each scenario: a healthy row and one per variant it drifts, in both modes.
    assert len(rows) == 2 * (3 + 3 + 3 + 2 + 2)


@pytest.mark.slow  # scores a block twice
def test_a_policy_file_reaches_the_judge(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A block's streams hold fewer pairs after the onset than the default min_pairs
    # (20), so nothing is called; a policy file with min_pairs 5 lets teacher-forced KL
    # call int3 within the stream, and the section names the file.
    folder = tmp_path / "pairs"
    folder.mkdir()
    shutil.copy(BLOCK, folder / BLOCK.name)
    policy = tmp_path / "policy.yaml"
    policy.write_text("default:\n  min_pairs: 5\n")
    argv = ["--corpus", str(folder), "--draws", "3", "--sizes", "6", "--modes", "full"]
    argv += ["--no-slices", "--embedder", "static", "--json"]
    docs = []
    for extra in ([], ["--policy", str(policy)]):
        assert eval_corpus.main([*argv, *extra]) == 0
        docs.append(json.loads(capsys.readouterr().out.strip().splitlines()[-1]))

    def int3_missed(doc: dict[str, object]) -> int:
        rows = doc["rows"]
        assert isinstance(rows, list)
        (row,) = [r for r in rows if r["scenario"] == "traffic mix" and r["variant"] == "int3-g64"]
        return int(row["missed"])

    assert int3_missed(docs[0]) == 3 and int3_missed(docs[1]) < 3
    assert docs[1]["policy"] == str(policy)
    assert f"--policy {policy}" in eval_corpus.markdown(docs[1])
