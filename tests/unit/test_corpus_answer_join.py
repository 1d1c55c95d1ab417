"""Checkable answers joined to the recorded corpus from its prompts file.

Blocks 0-22 were recorded before pairs carried an expected answer (later ones carry
their own); the join gives each pair its prompt's. What the join must yield is counted
here from the raw files (JSON lines, no quantdrift code): per answer kind, the pairs
whose prompt has a checkable answer, and the answer itself. Then the evaluation's
correctness table on the first block is counted apart from it, pair by pair, with the
answer checker.
"""

from __future__ import annotations

import gzip
import json
import lzma
import re
import shutil
from collections import Counter
from pathlib import Path

import pytest

from quantdrift.cli import main
from quantdrift.config import EmbeddingSettings
from quantdrift.detectors.correctness import answer_ok
from quantdrift.evaluation.answers import join_answers
from quantdrift.evaluation.corpus import prompt_of
from quantdrift.lab.corpus.build import answers, load
from quantdrift.schemas import PairEvent
from quantdrift.services import corpus_eval
from quantdrift.services.pairs import read_pairs

CORPUS = Path(__file__).resolve().parents[2] / "corpus"
PAIRS = CORPUS / "pairs"
PROMPTS = CORPUS / "prompts.jsonl.gz"
BLOCK = PAIRS / "block-00000.jsonl.xz"
KINDS = ("number", "json", "label", "text")


def raw_prompts() -> dict[str, dict[str, object]]:
    with gzip.open(PROMPTS, "rt", encoding="utf-8") as f:
        return {d["prompt_id"]: d for d in map(json.loads, f)}


def raw_pairs(files: list[Path]) -> list[dict[str, object]]:
    out = []
    for path in files:
        with lzma.open(path, "rt", encoding="utf-8") as f:
            out += [json.loads(line) for line in f if line.strip()]
    return out


def raw_checkable(prompt: dict[str, object]) -> tuple[str, str] | None:
    """The corpus's rule, restated: an answer of a checkable kind; a ``text`` task whose
    answer is a bare number is left unchecked (it sits among other figures)."""
    answer, kind = prompt.get("answer"), prompt["output_kind"]
    if not isinstance(answer, str) or kind not in KINDS:
        return None
    if kind == "text" and re.fullmatch(r"-?\d+(\.\d+)?", answer.strip()):
        return None
    return answer, str(kind)


@pytest.mark.slow  # reads every committed block: grows with the corpus
def test_the_join_gives_every_recorded_pair_its_prompts_checkable_answer() -> None:
    prompts = raw_prompts()
    files = sorted(PAIRS.glob("block-*.jsonl.xz"))
    raw = raw_pairs(files)
    want: Counter[str] = Counter()
    want_answer: dict[str, tuple[str, str]] = {}
    for d in raw:
        pid = str(d["pair_id"])[: -len(str(d["label"])) - 1]
        request = d["request"]
        assert isinstance(request, dict)
        if request.get("expected_answer") is not None:
            # Blocks recorded since the recorder set answers carry their own kind.
            want["carried"] += 1
            want[str(request.get("answer_kind"))] += 1
            continue
        c = raw_checkable(prompts[pid])
        want["joined" if c else "unchecked"] += 1
        if c:
            want[c[1]] += 1
            want_answer[str(d["pair_id"])] = c
    assert want["joined"] > 1000, "the committed corpus has checkable prompts of every kind"
    assert all(want[k] > 0 for k in KINDS)

    pairs = read_pairs(PAIRS)
    joined, count = join_answers(pairs, answers(load(PROMPTS)), prompt_of)
    assert count.as_dict() == {
        "carried": want["carried"],
        "joined": want["joined"],
        "unchecked": want["unchecked"],
        "unknown": 0,
    }
    got = Counter(p.request.answer_kind for p in joined if p.request.expected_answer)
    assert {k: got[k] for k in KINDS} == {k: want[k] for k in KINDS}
    for p in joined:
        if p.pair_id in want_answer:
            assert (p.request.expected_answer, p.request.answer_kind) == want_answer[p.pair_id]
    # Nothing else of a pair changes: the same pairs, in order, with the same answers.
    assert [(p.pair_id, p.candidate, p.reference) for p in joined] == [
        (p.pair_id, p.candidate, p.reference) for p in pairs
    ]


def _pair(pid: str, prompt: str | None, expected: str | None = None) -> PairEvent:
    request = {"prompt": prompt, "expected_answer": expected, "answer_kind": "number"}
    return PairEvent.model_validate(
        {
            "pair_id": f"{pid}-int8",
            "ts": 0,
            "route": "r",
            "label": "int8",
            "candidate": {"text": "7"},
            "reference": {"text": "7"},
            "request": request if expected else {"prompt": prompt},
        }
    )


def test_a_prompt_that_is_not_the_files_is_refused_and_an_own_answer_kept() -> None:
    table = {"c0-1": ("42", "number", "user: how many?"), "c0-2": (None, None, "user: hi")}
    with pytest.raises(ValueError, match="not prompt c0-1"):
        join_answers([_pair("c0-1", "user: how many apples?")], table, prompt_of)
    pairs = [
        _pair("c0-1", "user: how many?", expected="41"),  # its own answer stands
        _pair("c0-1", None),  # a hashed prompt cannot be compared: joined by id
        _pair("c0-2", "user: hi"),
        _pair("c9-9", "user: ?"),
    ]
    out, count = join_answers(pairs, table, prompt_of)
    assert [p.request.expected_answer for p in out] == ["41", "42", None, None]
    assert count.as_dict() == {"carried": 1, "joined": 1, "unchecked": 1, "unknown": 1}


def test_the_correctness_table_counts_each_side_on_the_checkable_evaluation_prompts(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "pairs"
    folder.mkdir()
    shutil.copy(BLOCK, folder / BLOCK.name)
    variants = ("int4-g64-gptq", "int3-g64")
    request = corpus_eval.CorpusRequest(
        pairs=folder,
        healthy_label="int8",
        variants=variants,
        calibration_prompts=6,
        embedder="static",
        answers=answers(load(PROMPTS)),
    )
    ev = corpus_eval.load(EmbeddingSettings(), request)
    table = ev.correctness(variants)
    # Apart from the tally: the raw pairs of the evaluation prompts, checked one by one.
    prompts = raw_prompts()
    by_id = {str(d["pair_id"]): d for d in raw_pairs([BLOCK])}
    right: dict[str, Counter[str]] = {}
    for pid in ev.eval_pool:
        c = raw_checkable(prompts[pid])
        if c is None:
            continue
        for kind in (c[1], "all"):
            n = right.setdefault(kind, Counter())
            n["checkable"] += 1
            ref = by_id[f"{pid}-int8"]["reference"]
            assert isinstance(ref, dict)
            n["reference"] += bool(answer_ok(str(ref["text"]), *c))
            for label in ("int8", *variants):
                side = by_id[f"{pid}-{label}"]["candidate"]
                assert isinstance(side, dict)
                n[label] += bool(answer_ok(str(side["text"]), *c))
    assert right, "the first block's evaluation prompts hold checkable ones"
    assert set(table) == set(right)
    for kind, n in right.items():
        assert table[kind].checkable == n["checkable"]
        assert table[kind].rates() == {
            side: round(n[side] / n["checkable"], 4) for side in ("reference", "int8", *variants)
        }
    assert ev.joined.joined > 0 and ev.joined.unknown == 0


def test_eval_no_replay_prints_correctness_and_refuses_a_missing_prompts_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "pairs"
    folder.mkdir()
    shutil.copy(BLOCK, folder / BLOCK.name)
    base = ["eval", "--no-replay", "--embedder", "static", "--no-progress", "--healthy"]
    base += [str(folder), "--healthy-label", "int8", "--drifted-label", "int3-g64"]
    base += ["--calibration-prompts", "6", "--calibration-draws", "1"]
    assert main([*base, "--prompts", str(tmp_path / "none.jsonl.gz")]) == 2
    assert "no such prompts file" in capsys.readouterr().err
    assert main([*base, "--prompts", str(PROMPTS)]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("correct, all answers ("))
    assert re.search(r"reference \d+\.\d %, int8 \d+\.\d %, int3-g64 \d+\.\d %", line)
