"""Tokenizer: rouge-score's rule on ASCII, one token per CJK character elsewhere."""

from __future__ import annotations

import string

import pytest
from hypothesis import given
from hypothesis import strategies as st
from rouge_score.tokenizers import DefaultTokenizer

from quantdrift.detectors.tokenize import has_cjk, tokenize


@pytest.mark.parametrize(
    ("text", "tokens"),
    [
        ("", []),
        ("Hello, World!", ["hello", "world"]),
        ("snake_case and x2-y3", ["snake", "case", "and", "x2", "y3"]),
        ("我喜欢猫", ["我", "喜", "欢", "猫"]),
        ("我爱Python3!", ["我", "爱", "python3"]),
        ("東京タワーへ行く", ["東", "京", "タ", "ワ", "ー", "へ", "行", "く"]),
        ("한국어 텍스트", ["한", "국", "어", "텍", "스", "트"]),
        ("Café naïve", ["café", "naïve"]),
        ("ＡＢＣ１２３", ["abc123"]),  # full-width folds to ASCII (NFKC)
        ("emoji 😀🎉 gone", ["emoji", "gone"]),
        ("Привет, мир", ["привет", "мир"]),
        ("हिन्दी भाषा", ["हिन्दी", "भाषा"]),  # vowel signs stay inside the word
    ],
)
def test_tokenize(text: str, tokens: list[str]) -> None:
    assert tokenize(text) == tokens


@given(st.text(alphabet=string.printable, max_size=300))
def test_ascii_equals_rouge_score_tokenizer(text: str) -> None:
    assert tokenize(text) == DefaultTokenizer(use_stemmer=False).tokenize(text)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("", False), ("plain", False), ("café", False), ("猫", True), ("カ", True), ("한", True)],
)
def test_has_cjk(text: str, expected: bool) -> None:
    assert has_cjk(text) is expected
