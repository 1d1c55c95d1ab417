"""Repetition runs, looping tails, distinct-2, whitespace runs."""

from __future__ import annotations

import pytest

from quantdrift.detectors.repetition import (
    distinct_2,
    looping,
    repetition_run,
    token_ids,
    whitespace_run,
)
from quantdrift.detectors.tokenize import tokenize


def ids(text: str):  # type: ignore[no-untyped-def]
    return token_ids(tokenize(text))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", 0),
        ("one", 1),
        ("a plain sentence without repeats", 1),
        ("very very good", 2),
        ("no no no no no", 5),
        ("I think so. I think so. I think so. Yes.", 3),
        ("go go go then stop stop", 3),
        ("a b c d e f g h " * 4, 4),  # an 8-gram four times
        ("a b c d e f g h i " * 4, 1),  # a 9-gram loop is beyond n <= 8: looping() sees it
        ("猫猫猫猫", 4),
    ],
)
def test_repetition_run(text: str, expected: int) -> None:
    assert repetition_run(ids(text)) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", False),
        ("ha ha ha", False),  # under LOOP_MIN_TOKENS
        ("ha " * 8, True),
        ("Answer: 42. " + "I am sorry. " * 6, True),
        ("The answer is 42 and here is why: " + "because " * 3, False),  # tail too short
        (" ".join(f"w{i}" for i in range(200)) + " loop" * 40, True),  # long text, 40-token loop
        (" ".join(f"w{i}" for i in range(200)) + " loop" * 20, False),  # 20 < 32 of the tail
        ("1. item one 2. item two 3. item three 4. item four", False),  # shared prefix only
        ("loop loop loop loop loop loop loop loop then a normal ending here ok", False),
        ("我爱你" * 6, True),
    ],
)
def test_looping(text: str, expected: bool) -> None:
    assert looping(ids(text)) is expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [("", None), ("one", None), ("a b", 1.0), ("a b a b a", 0.5), ("x x x x x", 0.25)],
)
def test_distinct_2(text: str, expected: float | None) -> None:
    assert distinct_2(ids(text)) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [("", 0), ("abc", 0), ("a b", 1), ("a\n\n\n\nb", 4), ("x" + " " * 300, 300), ("\t \n", 3)],
)
def test_whitespace_run(text: str, expected: int) -> None:
    assert whitespace_run(text) == expected
