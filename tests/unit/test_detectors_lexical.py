"""ROUGE equals rouge-score on English, BLEU equals sacrebleu; Chinese by hand."""

from __future__ import annotations

import random
import time

import pytest
import sacrebleu
from hypothesis import given, settings
from hypothesis import strategies as st
from rouge_score import rouge_scorer

from quantdrift.detectors import lexical
from quantdrift.detectors.bleu import sentence_bleu
from quantdrift.detectors.tokenize import tokenize
from support.references import lcs_table

SCORER = rouge_scorer.RougeScorer(["rouge1", "rougeL"], use_stemmer=False)

ENGLISH = [
    ("The cat sat on the mat.", "The cat sat on the mat."),
    ("The cat sat on the mat.", "A cat was sitting on a mat."),
    ("Paris is the capital of France.", "The capital of France is Paris."),
    ("", "Something."),
    ("Something.", ""),
    ("", ""),
    ("!!!", "???"),
    ("the the the the", "the cat"),
    ("Q3 revenue grew 12% to $4.1B", "Revenue in Q3 grew by 12 percent to 4.1 billion dollars"),
    ("Use `pip install foo_bar==1.2`", "Run pip install foo-bar 1.2"),
]


@pytest.mark.parametrize(("cand", "ref"), ENGLISH)
def test_rouge_equals_rouge_score(cand: str, ref: str) -> None:
    expected = SCORER.score(ref, cand)
    c, r = tokenize(cand), tokenize(ref)
    assert lexical.rouge1_f(c, r) == expected["rouge1"].fmeasure
    assert lexical.rougeL_f(c, r) == expected["rougeL"].fmeasure


WORDS = [
    "the",
    "a",
    "cat",
    "dog",
    "sat",
    "ran",
    "on",
    "under",
    "mat",
    "rug",
    "big",
    "small",
    "red",
    "7",
    "42",
    "It's,",
    "it.",
    "and",
    "or",
]


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.sampled_from(WORDS), max_size=40).map(" ".join),
    st.lists(st.sampled_from(WORDS), max_size=40).map(" ".join),
)
def test_rouge_property_equals_rouge_score(cand: str, ref: str) -> None:
    expected = SCORER.score(ref, cand)
    c, r = tokenize(cand), tokenize(ref)
    assert lexical.rouge1_f(c, r) == expected["rouge1"].fmeasure
    assert lexical.rougeL_f(c, r) == expected["rougeL"].fmeasure


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="abcAB ,.\n", max_size=60), st.text(alphabet="abcAB ,.\n", max_size=60))
def test_lcs_equals_dynamic_programming(a: str, b: str) -> None:
    ta, tb = list(a), list(b)
    assert lexical.lcs_length(ta, tb) == lcs_table(ta, tb) == lexical.lcs_length(tb, ta)


@pytest.mark.parametrize(
    ("cand", "ref", "r1", "rl"),
    [
        # 我 喜 欢 猫 / 我 喜 欢 狗: 4 tokens each, 3 shared -> P = R = 3/4,
        # F = 2 * 0.75 * 0.75 / 1.5 = 0.75; LCS 我喜欢 = 3 -> ROUGE-L 0.75 too.
        ("我喜欢猫", "我喜欢狗", 0.75, 0.75),
        # 今 天 天 气 很 好 / 天 气 今 天 很 好: same multiset -> ROUGE-1 = 1;
        # LCS = 4 (e.g. 天 气 很 好), P = R = 4/6 -> ROUGE-L = 2/3.
        ("今天天气很好", "天气今天很好", 1.0, 2 / 3),
        # 猫 が 好 き / 犬 が 好 き: 3 of 4 shared, in order -> 0.75 / 0.75.
        ("猫が好き", "犬が好き", 0.75, 0.75),
        # 我 爱 python / 我 爱 python: case and punctuation do not count -> 1 / 1.
        ("我爱Python!", "我爱python", 1.0, 1.0),
        # 你 好 (2) vs 你 好 世 界 (4): overlap 2, P = 1, R = 1/2,
        # F = 2 * 1 * 0.5 / 1.5 = 2/3; LCS 2 -> same.
        ("你好", "你好世界", 2 / 3, 2 / 3),
    ],
)
def test_rouge_chinese_by_hand(cand: str, ref: str, r1: float, rl: float) -> None:
    c, r = tokenize(cand), tokenize(ref)
    assert lexical.rouge1_f(c, r) == pytest.approx(r1, abs=1e-12)
    assert lexical.rougeL_f(c, r) == pytest.approx(rl, abs=1e-12)


@pytest.mark.parametrize(
    ("cand", "ref"),
    [
        *ENGLISH,
        ("我喜欢猫", "我喜欢狗"),
        ("今天天气很好。", "今天天气不错。"),
        ("東京へ行きます", "東京に行きます"),
    ],
)
def test_bleu_equals_sacrebleu(cand: str, ref: str) -> None:
    tok = "zh" if any("\u3040" <= ch <= "\u9fff" for ch in cand + ref) else "13a"
    expected = sacrebleu.sentence_bleu(cand, [ref], tokenize=tok).score / 100
    assert sentence_bleu(cand, ref) == pytest.approx(min(expected, 1.0), abs=1e-12)
    assert 0.0 <= sentence_bleu(cand, ref) <= 1.0


def test_bleu_uses_zh_tokenizer_for_cjk() -> None:
    # With 13a the whole sentence is one token and a one-character change scores 0.
    assert sentence_bleu("我喜欢猫。", "我喜欢狗。") > 0.0


@pytest.mark.parametrize(
    ("cand", "ref", "expected"),
    [
        ([], [], 1.0),
        (["a"], [], 0.0),
        (["a", "b"], ["b", "c"], 1 / 3),
        (["a", "a"], ["a"], 1.0),
    ],
)
def test_jaccard(cand: list[str], ref: list[str], expected: float) -> None:
    assert lexical.jaccard(cand, ref) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("cand", "ref", "expected"),
    [([], [], 1.0), (["a"] * 3, [], 3.0), ([], ["a"], 0.0), (["a"] * 3, ["a"] * 2, 1.5)],
)
def test_length_ratio(cand: list[str], ref: list[str], expected: float) -> None:
    assert lexical.length_ratio(cand, ref) == expected


@pytest.mark.parametrize(
    ("cand", "ref", "expected"),
    [
        ("a b c", "a b c", None),
        ("", "", None),
        ("a b c", "a x c", 1),
        ("a b", "a b c", 2),
        ("x", "a", 0),
        ("", "a", 0),
    ],
)
def test_first_divergence(cand: str, ref: str, expected: int | None) -> None:
    assert lexical.first_divergence(cand.split(), ref.split()) == expected


def test_rouge_l_is_fast_on_200_words() -> None:
    rng = random.Random(7)
    vocab = [f"w{i}" for i in range(300)]
    a = [rng.choice(vocab) for _ in range(200)]
    b = [rng.choice(vocab) for _ in range(200)]
    start = time.perf_counter()
    for _ in range(20):
        lexical.rougeL_f(a, b)
    per_pair = (time.perf_counter() - start) / 20
    assert per_pair < 0.005  # rouge-score's DP table takes ~12 ms here
    assert lexical.lcs_length(a, b) == lcs_table(a, b)
