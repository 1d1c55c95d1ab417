"""Every pure metric: no crash on any string, input not mutated, deterministic, in range."""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quantdrift.detectors import bleu
from quantdrift.detectors import entropy as ent
from quantdrift.detectors import lexical as lex
from quantdrift.detectors import repetition as rep
from quantdrift.detectors.json_contract import check_json_contract
from quantdrift.detectors.suite import score_text_pair, verdict
from quantdrift.detectors.tokenize import has_cjk, tokenize
from quantdrift.schemas import RequestInfo

# Any unicode (emoji, CJK, combining marks, lone surrogates), plus CJK-heavy and
# repetitive text so the interesting branches are reached, not just random noise.
TEXT = st.one_of(
    st.text(max_size=200),
    st.text(st.characters(exclude_categories=()), max_size=40),  # lone surrogates too
    st.text(alphabet="我喜欢猫狗。 的是 カナ한국😀", max_size=60),
    st.lists(st.sampled_from(["the", "cat", "loop", "!", "\n", " "]), max_size=80).map("".join),
)


def unit(x: float) -> bool:
    return 0.0 <= x <= 1.0 and math.isfinite(x)


# name -> (function of (cand tokens, ref tokens), range check)
TOKEN_PAIR_METRICS: dict[
    str, tuple[Callable[[list[str], list[str]], Any], Callable[[Any], bool]]
] = {
    "rouge1_f": (lex.rouge1_f, unit),
    "rougeL_f": (lex.rougeL_f, unit),
    "jaccard": (lex.jaccard, unit),
    "length_ratio": (lex.length_ratio, lambda x: x >= 0 and math.isfinite(x)),
    "first_divergence": (lex.first_divergence, lambda x: x is None or x >= 0),
    "lcs_length": (lex.lcs_length, lambda x: isinstance(x, int) and x >= 0),
}


@pytest.mark.parametrize("name", sorted(TOKEN_PAIR_METRICS))
@settings(max_examples=150, deadline=None)
@given(cand=TEXT, ref=TEXT)
def test_token_pair_metric(name: str, cand: str, ref: str) -> None:
    fn, in_range = TOKEN_PAIR_METRICS[name]
    c, r = tokenize(cand), tokenize(ref)
    c0, r0 = list(c), list(r)
    out = fn(c, r)
    assert (c, r) == (c0, r0), "input mutated"
    assert fn(c, r) == out, "not deterministic"
    assert in_range(out), f"{name}={out!r} out of range"


@settings(max_examples=150, deadline=None)
@given(cand=TEXT, ref=TEXT)
def test_symmetric_metrics(cand: str, ref: str) -> None:
    c, r = tokenize(cand), tokenize(ref)
    assert lex.rouge1_f(c, r) == pytest.approx(lex.rouge1_f(r, c))
    assert lex.rougeL_f(c, r) == pytest.approx(lex.rougeL_f(r, c))
    assert lex.lcs_length(c, r) == lex.lcs_length(r, c) <= min(len(c), len(r))
    if c == r and c:
        assert lex.rougeL_f(c, r) == 1.0 and lex.first_divergence(c, r) is None


@settings(max_examples=150, deadline=None)
@given(cand=TEXT, ref=TEXT)
def test_bleu(cand: str, ref: str) -> None:
    out = bleu.sentence_bleu(cand, ref)
    assert unit(out) and bleu.sentence_bleu(cand, ref) == out


@settings(max_examples=200, deadline=None)
@given(text=TEXT)
def test_tokenizer_and_text_metrics(text: str) -> None:
    tokens = tokenize(text)
    assert tokens == tokenize(text)
    assert all(t and t == t.lower() and not any(ch.isspace() for ch in t) for t in tokens)
    assert isinstance(has_cjk(text), bool)
    ids = rep.token_ids(tokens)
    before = ids.copy()
    run = rep.repetition_run(ids)
    assert (run == 0) == (not tokens) and run <= max(len(tokens), 0)
    assert isinstance(rep.looping(ids), bool)
    d2 = rep.distinct_2(ids)
    assert d2 is None or (0.0 < d2 <= 1.0)
    assert (ids == before).all(), "input mutated"
    ws = rep.whitespace_run(text)
    assert 0 <= ws <= len(text)


@settings(max_examples=150, deadline=None)
@given(text=TEXT, keys=st.lists(st.text(max_size=5), max_size=3))
def test_json_contract_never_crashes(text: str, keys: list[str]) -> None:
    req = RequestInfo(expects_json=True, expected_keys=keys or None)
    ok, error = check_json_contract(text, req)
    assert ok in (True, False) and (error is None) == ok
    assert check_json_contract(text, req) == (ok, error)


LOGPROBS = st.dictionaries(
    st.text(min_size=1, max_size=3),
    st.floats(min_value=-1e300, max_value=50, allow_nan=False, allow_infinity=False),
    max_size=5,
)


@settings(max_examples=200, deadline=None)
@given(ref=st.lists(LOGPROBS, max_size=8), cand=st.lists(LOGPROBS, max_size=8))
def test_distribution_metrics(ref: list[dict[str, float]], cand: list[dict[str, float]]) -> None:
    ref0, cand0 = copy.deepcopy(ref), copy.deepcopy(cand)
    kl, flips = ent.kl_and_flip_rate(ref, cand)
    assert (ref, cand) == (ref0, cand0), "input mutated"
    assert (kl, flips) == ent.kl_and_flip_rate(ref, cand)
    assert kl is None or (kl >= 0 and math.isfinite(kl))
    assert flips is None or unit(flips)
    h = ent.entropy_from_top_logprobs(cand)
    assert (h >= 0).all() and len(h) == sum(1 for d in cand if d)
    mean, low = ent.entropy_stats(h)
    assert mean is None or (low is not None and 0 <= low <= mean + 1e-12)


@settings(max_examples=100, deadline=None)
@given(cand=TEXT, ref=TEXT)
def test_score_text_pair_and_verdict(cand: str, ref: str) -> None:
    metrics = score_text_pair(cand, ref, None)
    assert metrics == score_text_pair(cand, ref, None)
    v, reasons = verdict(metrics)
    assert v in ("ok", "drift", "anomaly") and (v == "ok") == (not reasons)
