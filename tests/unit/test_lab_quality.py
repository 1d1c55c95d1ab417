"""Lab quality scoring on hand-made pairs."""

from __future__ import annotations

import pytest

from quantdrift.data.prompts import PROMPTS
from quantdrift.lab.quality import (
    format_table,
    json_valid,
    needle_answer,
    needle_hit,
    quality_by_variant,
)
from quantdrift.schemas import PairEvent
from quantdrift.schemas.pair import ModelOutput, RequestInfo

JSON_PROMPT = next(p for p in PROMPTS if p.task == "json")
NEEDLE_PROMPT = next(p for p in PROMPTS if p.task == "needle")


@pytest.mark.parametrize(
    ("text", "keys", "ok"),
    [
        ('{"name": "Maria", "age": 34, "city": "Madrid"}', ["name", "age", "city"], True),
        ('```json\n{"name": "Maria", "age": 34, "city": "Madrid"}\n```', ["name", "age"], True),
        ('Sure! {"a": 1} Hope this helps.', ["a"], True),
        ('{"name": "Maria", "age": 34', ["name"], False),  # truncated
        ('{"name": "Maria"}', ["name", "age"], False),  # missing key
        ("[1, 2, 3]", None, False),  # not an object
        ("no json here", None, False),
        ("{}", None, True),
    ],
)
def test_json_valid(text: str, keys: list[str] | None, ok: bool) -> None:
    assert json_valid(text, keys) is ok


@pytest.mark.parametrize(
    ("text", "answer", "ok"),
    [
        ("The code is 7319.", "7319", True),
        ("It is LISBON.", "Lisbon", True),
        ("No idea", "Priya", False),
    ],
)
def test_needle_hit(text: str, answer: str, ok: bool) -> None:
    assert needle_hit(text, answer) is ok


def test_every_needle_and_json_prompt_is_scorable() -> None:
    needles = [p for p in PROMPTS if p.task == "needle"]
    jsons = [p for p in PROMPTS if p.task == "json"]
    assert needles and jsons
    assert all(p.answer and p.answer in p.text for p in needles)
    assert all(p.expected_keys and p.expects_json for p in jsons)
    assert any(any("\u4e00" <= ch <= "\u9fff" for ch in p.text) for p in PROMPTS)


def _pair(n: int, prompt, cand: str, ref: str, precision: str, kind: str = "shadow") -> PairEvent:
    return PairEvent(
        pair_id=f"p{n}",
        ts=0.0,
        route="lab/x",
        kind=kind,
        candidate=ModelOutput(text=cand, precision=precision),
        reference=ModelOutput(text=ref, precision="ref-f32"),
        request=RequestInfo(
            prompt=prompt.text,
            task=prompt.task,
            expects_json=prompt.expects_json,
            expected_keys=list(prompt.expected_keys) if prompt.expected_keys else None,
        ),
        label=precision[:4] if kind == "shadow" else "noise",
    )


def test_quality_by_variant() -> None:
    good = '{"name": "Maria Lopez", "age": 34, "city": "Madrid"}'
    answer = NEEDLE_PROMPT.answer
    assert answer is not None and needle_answer(_pair(0, NEEDLE_PROMPT, "", "", "x")) == answer
    pairs = [
        _pair(1, JSON_PROMPT, good, good, "int8"),
        _pair(2, NEEDLE_PROMPT, f"It is {answer}.", f"It is {answer}.", "int8"),
        _pair(3, JSON_PROMPT, '{"name": "Maria", "name": ', good, "int2-g64"),
        _pair(4, JSON_PROMPT, good, good, "int2-g64"),
        _pair(5, NEEDLE_PROMPT, "the the the the", f"It is {answer}.", "int2-g64"),
        _pair(6, NEEDLE_PROMPT, f"{answer}", f"It is {answer}.", "ref-f32", kind="noise"),
    ]
    rows = {r.variant: r for r in quality_by_variant(pairs)}
    assert list(rows) == ["int8", "int2-g64", "noise"]
    assert rows["int8"].json_valid == 1.0 and rows["int8"].needle_recall == 1.0
    assert rows["int8"].exact_match == 1.0
    assert rows["int2-g64"].json_pairs == 2 and rows["int2-g64"].json_valid == 0.5
    assert rows["int2-g64"].json_valid_ref == 1.0
    assert rows["int2-g64"].needle_recall == 0.0 and rows["int2-g64"].needle_recall_ref == 1.0
    assert rows["noise"].needle_recall == 1.0 and rows["noise"].json_valid is None
    table = format_table(list(rows.values()))
    assert "int2-g64" in table and "50%" in table and table.count("\n") == 3
