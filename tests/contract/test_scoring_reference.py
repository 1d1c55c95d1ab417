"""The worker's scorer gives the metrics a straightforward computation gives.

The scoring path tokenizes, counts and checks each distinct text of a batch
once, and the static tier caches word pieces by word: both for speed. Neither
may move a number. So each metric of the ScoreEvent the
worker would publish (scorer from the factory, as the worker builds it, one
batch and one pair at a time) is compared with the libraries called directly
(sacrebleu's ``sentence_score``, rouge-score on ASCII texts, the tokenizer on
whole texts) or with a plain loop, on the shipped lab pairs, on the bench's
seeded pairs and on awkward text.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Sequence
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from common import long_pairs  # bench/ is not a package
from hypothesis import given, settings
from hypothesis import strategies as st
from rouge_score import rouge_scorer
from sacrebleu.metrics import BLEU

from quantdrift.config import EmbeddingSettings
from quantdrift.detectors import bleu
from quantdrift.detectors import entropy as ent
from quantdrift.detectors import repetition as rep
from quantdrift.detectors.json_contract import check_json_contract
from quantdrift.detectors.semantic import cosine_pairs
from quantdrift.detectors.suite import score_event
from quantdrift.detectors.tokenize import has_cjk, tokenize
from quantdrift.embedding.factory import build_scorer, score_with
from quantdrift.embedding.static import StaticEmbedder
from quantdrift.embedding.tiered import TieredScorer
from quantdrift.schemas import Metrics, ModelOutput, PairEvent
from quantdrift.services.pairs import read_pairs
from support.references import lcs_table

SACREBLEU = {tok: BLEU(effective_order=True, tokenize=tok) for tok in ("13a", "zh")}
ROUGE = rouge_scorer.RougeScorer(["rouge1", "rougeL"], use_stemmer=False)

AWKWARD = [
    "",
    " ",
    "  two  spaces   between\twords\nand lines ",
    "Ünïcödé café naïve résumé, ﬁ ligature, ＡＢＣ１２",
    "ΣΊΣΥΦΟΣ ΟΔΟΣ σοφός",
    "a\u0301 e\u0301 \u0301lone combining mark",
    "ctrl\x1cchars\x1f and\x00nul and \ufffd replacement",
    "我喜欢猫 (cats) ですね 안녕하세요 東京へ行きます。",
    "x" * 300 + " " + "word " * 300,
    '{"name":"Ada","age":36,"tags":["a","b"]}',
    "no no no no no no no no no no",
    "I think so. I think so. I think so. Yes.",
    "trailing period ." + " end .",
    "hyphen-\nated &amp; entities &lt;b&gt; <skipped> text",
    "\u00a0non-breaking\u00a0spaces\u2003em space\u200bzero width",
]


def _lab_pairs() -> list[PairEvent]:
    return list(read_pairs())


def _bench_pairs() -> list[PairEvent]:
    return long_pairs(40, seed=7)


def _awkward_pairs() -> list[PairEvent]:
    texts = AWKWARD
    return [
        PairEvent(
            pair_id=f"awkward-{i}-{j}",
            route="r/awkward",
            ts=0.0,
            candidate=ModelOutput(text=c),
            reference=ModelOutput(text=r),
        )
        for i, c in enumerate(texts)
        for j, r in enumerate(texts)
        if (i + j) % 3 == 0
    ]


# --- straightforward reference computations ---------------------------------


def bleu_ref(cand: str, ref: str) -> float:
    tok = "zh" if has_cjk(cand) or has_cjk(ref) else "13a"
    return min(max(SACREBLEU[tok].sentence_score(cand, [ref]).score / 100.0, 0.0), 1.0)


def f1(p: float, r: float) -> float:
    return 2 * p * r / (p + r) if p + r > 0 else 0.0


def repetition_run_ref(tokens: Sequence[str], max_n: int = rep.MAX_NGRAM) -> int:
    """Most consecutive copies of any n-gram, by trying every start and every n."""
    if not tokens:
        return 0
    best = 1
    for n in range(1, min(max_n, len(tokens) // 2) + 1):
        for start in range(len(tokens)):
            copies = 1
            while tokens[start + copies * n : start + (copies + 1) * n] == tokens[
                start : start + n
            ] and start + (copies + 1) * n <= len(tokens):
                copies += 1
            best = max(best, copies)
    return best


def reference_metrics(pair: PairEvent, cosine: float | None, tier: str | None) -> Metrics:
    c, r = pair.candidate, pair.reference
    ct, rt = tokenize(c.text), tokenize(r.text)
    lcs = lcs_table(ct, rt)
    overlap = sum((Counter(ct) & Counter(rt)).values())
    rouge1 = f1(overlap / max(len(ct), 1), overlap / max(len(rt), 1))
    rougeL = f1(lcs / len(ct), lcs / len(rt)) if ct and rt else 0.0
    if c.text.isascii() and r.text.isascii():
        # Our tokenizer is rouge-score's on ASCII: the library itself must agree.
        lib = ROUGE.score(r.text, c.text)
        assert (rouge1, rougeL) == (lib["rouge1"].fmeasure, lib["rougeL"].fmeasure)
    union = set(ct) | set(rt)
    bigrams = list(pairwise(ct))
    cand_h, ref_h = ent.token_entropies(c), ent.token_entropies(r)
    h_mean, h_min = ent.entropy_stats(cand_h)
    ref_mean, _ = ent.entropy_stats(ref_h)
    kl, flips = ent.kl_and_flip_rate(r.top_logprobs, c.top_logprobs)
    json_ok, json_error = check_json_contract(c.text, pair.request)
    on_cand = pair.reference_logprobs_on_candidate
    first = next((i for i, (a, b) in enumerate(zip(ct, rt, strict=False)) if a != b), None)
    if first is None and len(ct) != len(rt):
        first = min(len(ct), len(rt))

    def finite(x: float | None) -> float | None:
        return x if x is None or math.isfinite(x) else None

    return Metrics(
        cosine=cosine,
        cosine_tier=tier if cosine is not None else None,
        bleu=bleu_ref(c.text, r.text),
        rouge1=rouge1,
        rougeL=rougeL,
        jaccard=len(set(ct) & set(rt)) / len(union) if union else 1.0,
        length_ratio=(len(ct) / len(rt)) if rt else (1.0 if not ct else float(len(ct))),
        first_divergence=first,
        entropy_mean=finite(h_mean),
        entropy_min=finite(h_min),
        entropy_shift=finite(ent.entropy_shift(h_mean, ref_mean)),
        kl=finite(kl),
        flip_rate=flips,
        tf_gap=finite(ent.teacher_forced_gap(r.token_logprobs, on_cand)),
        tf_kl=finite(ent.teacher_forced_kl(c.token_logprobs, on_cand)),
        repetition_run=repetition_run_ref(ct),
        looping=rep.looping(rep.token_ids(ct)),
        distinct_2=len(set(bigrams)) / len(bigrams) if bigrams else None,
        whitespace_run=rep.whitespace_run(c.text),
        json_ok=json_ok,
        json_error=json_error,
        reference_json_ok=check_json_contract(r.text, pair.request)[0],
        candidate_tokens=len(ct),
        reference_tokens=len(rt),
        reference_repetition_run=repetition_run_ref(rt),
        reference_looping=rep.looping(rep.token_ids(rt)),
        reference_whitespace_run=rep.whitespace_run(r.text),
        finished=None if not c.finish_reason else c.finish_reason != "length",
        reference_finished=None if not r.finish_reason else r.finish_reason != "length",
    )


class WholeTextStatic(StaticEmbedder):
    """The static tier as it was: the tokenizer on whole texts, no word cache."""

    def token_ids(self, texts: Sequence[str]) -> list[list[int]]:
        encodings = self._tokenizer.encode_batch_fast(list(texts), add_special_tokens=False)
        return [enc.ids for enc in encodings]


def static_cosine_ref(scorer: TieredScorer, pair: PairEvent, plain: StaticEmbedder) -> float:
    c, r = pair.candidate.text, pair.reference.text
    if c == r:
        return 1.0
    raw = cosine_pairs(plain, [c], [r])
    return float(scorer.calibration.apply(raw)[0])


def assert_same(got: dict[str, Any], want: dict[str, Any], where: str) -> None:
    for key, value in want.items():
        mine = got[key]
        if isinstance(value, float) and isinstance(mine, float):
            assert mine == pytest.approx(value, abs=1e-12, rel=0), f"{where}: {key}"
        else:
            assert mine == value, f"{where}: {key}"


# --- the contract -------------------------------------------------------------


@pytest.fixture(scope="module")
def scorer() -> TieredScorer:
    # The static tier from the factory: the worker's path without MiniLM (whose cosines
    # the changes do not touch); every other metric is computed as for any tier.
    built = build_scorer(EmbeddingSettings(tier="static"))
    assert isinstance(built, TieredScorer)
    return built


@pytest.fixture(scope="module")
def plain(scorer: TieredScorer) -> StaticEmbedder:
    assert isinstance(scorer.static, StaticEmbedder)
    return WholeTextStatic(scorer.static.path)


@pytest.mark.parametrize("source", [_lab_pairs, _bench_pairs, _awkward_pairs])
def test_score_events_equal_the_reference_computation(
    source: Any, scorer: TieredScorer, plain: StaticEmbedder
) -> None:
    pairs = source()
    batched = score_with(scorer, pairs)  # one batch: texts shared across pairs
    for i, (pair, metrics) in enumerate(zip(pairs, batched, strict=True)):
        if i % 5 == 0:  # a share is enough to show the batch a pair came in changes nothing
            (alone,) = score_with(scorer, [pair])
            assert alone == metrics
        want = reference_metrics(pair, static_cosine_ref(scorer, pair, plain), "static")
        got_event, want_event = score_event(pair, metrics), score_event(pair, want)
        assert_same(got_event.metrics.model_dump(), want_event.metrics.model_dump(), pair.pair_id)
        assert (got_event.verdict, got_event.reasons) == (want_event.verdict, want_event.reasons)


def test_word_cache_equals_the_tokenizer_on_whole_texts(scorer: TieredScorer) -> None:
    assert isinstance(scorer.static, StaticEmbedder)
    texts = [
        t
        for p in [*_lab_pairs(), *_bench_pairs(), *_awkward_pairs()]
        for t in (p.candidate.text, p.reference.text)
    ]
    tokenizer = scorer.static._tokenizer
    want = [e.ids for e in tokenizer.encode_batch_fast(texts, add_special_tokens=False)]
    # A cache too small for the texts: it is cleared and refilled mid-stream.
    small = StaticEmbedder(scorer.static.path, cache_words=200)
    got = [ids for i in range(0, len(texts), 16) for ids in small.token_ids(texts[i : i + 16])]
    assert got == want
    words = {w for t in texts for w in t.split(" ") if w}
    assert len(small._word_ids) < len(words)  # the bound held: the cache started over


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from("ab .,\n\t-Éé猫\u0301\x1c"), max_size=40))
def test_word_cache_equals_the_tokenizer_on_generated_text(text: str) -> None:
    emb = _STATIC
    want = emb._tokenizer.encode_batch_fast([text], add_special_tokens=False)[0].ids
    assert emb.token_ids([text]) == [want]


_STATIC = StaticEmbedder()


@settings(max_examples=300, deadline=None)
@given(
    st.text(alphabet=st.sampled_from("ab c.,!?'-&;猫狗\n"), max_size=60),
    st.text(alphabet=st.sampled_from("ab c.,!?'-&;猫狗\n"), max_size=60),
)
def test_bleu_equals_sacrebleu_on_generated_text(cand: str, ref: str) -> None:
    assert bleu.sentence_bleu(cand, ref) == bleu_ref(cand, ref)


# Every character class sacrebleu's tokenizers treat apart: its padded ASCII
# punctuation, the context rules' period, comma, dash and digits, its escapes and
# line joins, CJK inside and just outside its ranges (U+2000 and U+2001 sit on the
# two-character range end), and other scripts.
_TOKENIZER_ALPHABET = st.sampled_from(
    [*"ab9 .,-!?'\"&;:/<>@[]{}~^_`|\n\t", "&amp;", "&quot;", "<skipped>", "-\n",
     "猫", "。", "\u2000", "\u2001", "\u2014", "\u2a6d", "\u2a6e", "\uff01", "é", "ß", "\U00020001"]
)  # fmt: skip


@settings(max_examples=500, deadline=None)
@given(st.lists(_TOKENIZER_ALPHABET, max_size=40).map("".join))
def test_tokenizers_equal_sacrebleus(line: str) -> None:
    for name, tokenizer in (("13a", bleu.tokenize_13a), ("zh", bleu.tokenize_zh)):
        assert tokenizer(line) == SACREBLEU[name].tokenizer(line), name


def test_zh_class_is_sacrebleus_predicate_on_every_code_point() -> None:
    from sacrebleu.tokenizers.tokenizer_zh import TokenizerZh

    is_chinese = TokenizerZh._is_chinese_char.__wrapped__
    chars = bleu._zh_chars()
    wrong = [
        cp
        for cp in range(0x110000)
        if (chars.fullmatch(chr(cp)) is not None) != is_chinese(chr(cp))
    ]
    assert not wrong, [hex(cp) for cp in wrong[:10]]


@settings(max_examples=500, deadline=None)
@given(st.lists(st.sampled_from("abc"), max_size=40), st.integers(1, 9))
def test_repetition_run_equals_a_plain_loop(tokens: list[str], max_n: int) -> None:
    ids = rep.token_ids(tokens)
    assert rep.repetition_run(ids, max_n) == repetition_run_ref(tokens, max_n)
    assert rep.repetition_run(ids - 5, max_n) == repetition_run_ref(tokens, max_n)  # any ids
    bigrams = list(pairwise(tokens))
    assert rep.distinct_2(ids) == (len(set(bigrams)) / len(bigrams) if bigrams else None)


def test_reference_loops_themselves_are_right() -> None:
    # The plain loop is the oracle above; it must itself match hand-worked cases.
    assert repetition_run_ref([]) == 0
    assert repetition_run_ref(list("abab")) == 2
    assert repetition_run_ref(list("xabcabcabcy")) == 3
    assert lcs_table("ABCBDAB", "BDCABA") == 4
    assert np.isclose(f1(0.5, 0.5), 0.5)


def test_a_tokenizer_where_spaces_matter_encodes_whole_texts(tmp_path: Path) -> None:
    # The word cache is sound for the BERT normalizer and pre-tokenizer only; a model
    # whose tokenizer keeps spaces in its tokens (Metaspace) must be encoded whole.
    src = _STATIC.path
    spec = json.loads((src / "tokenizer.json").read_text())
    spec["pre_tokenizer"] = {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always"}
    (tmp_path / "tokenizer.json").write_text(json.dumps(spec))
    (tmp_path / "model.safetensors").symlink_to(src / "model.safetensors")
    other = StaticEmbedder(tmp_path)
    assert _STATIC._by_word and not other._by_word
    texts = ["two  spaces and one", " leading", "plain words here"]
    want = [e.ids for e in other._tokenizer.encode_batch_fast(texts, add_special_tokens=False)]
    assert other.token_ids(texts) == want
