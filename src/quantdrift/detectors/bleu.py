"""Sentence BLEU as sacrebleu computes it, with each text tokenized and counted once.

The number is sacrebleu's ``BLEU(effective_order=True, tokenize=...)
.sentence_score(candidate, [reference])``, divided by 100 and clipped to [0, 1]:
the tokenizer is ``zh`` when either text has CJK, else ``13a``, and the final
arithmetic is sacrebleu's own ``BLEU.compute_bleu``. Property tests hold the
result equal (``==``) to ``sentence_score``.

Why not call ``sentence_score``: a scoring worker spent about a tenth of its CPU
in it on long pairs, and most of that was not BLEU's arithmetic:

* it re-counts both texts' n-grams on every call, while a batch often scores
  one text against several partners (a reference asked again); here a text's
  n-grams are a value (:class:`BleuNgrams`) the caller keeps;
* on Python 3.11, ``re.sub`` with a ``\\1`` template expands every match in
  Python, and sacrebleu's tokenizers pad every space and punctuation mark, and
  every CJK character, that way. Padding single characters is a split on the
  class and a join, both in C, so the two per-character rules are done so
  here, from sacrebleu's own pattern and ranges; the three context rules
  (period, comma, dash) stay ``re.sub``, as in sacrebleu.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from functools import cache

from sacrebleu.metrics import BLEU
from sacrebleu.tokenizers.tokenizer_zh import _UCODE_RANGES

from quantdrift.detectors.tokenize import has_cjk

ORDER = 4  # sacrebleu's default max n-gram order

# mteval-v13a's rules after the first (sacrebleu's TokenizerRegexp), applied in order.
_CONTEXT_RULES = (
    # period and comma unless preceded by a digit
    (re.compile(r"([^0-9])([\.,])"), r"\1 \2 "),
    # period and comma unless followed by a digit
    (re.compile(r"([\.,])([^0-9])"), r" \1 \2"),
    # dash when preceded by a digit
    (re.compile(r"([0-9])(-)"), r"\1 \2 "),
)
# The first rule pads each character of this class with spaces. Splitting on the
# class with a capturing group and joining the parts with one space is the same
# string, in C (``re.sub`` with a template would expand every match in Python).
_PADDED = re.compile(r"([\{-\~\[-\` -\&\(-\+\:-\@\/])")


def _pad(pattern: re.Pattern[str], line: str) -> str:
    """``pattern.sub(r" \\1 ", line)`` for a one-character capturing ``pattern``.

    >>> _pad(_PADDED, "a!!b")
    'a !  ! b'
    """
    return " ".join(pattern.split(line))


@cache
def _zh_chars() -> re.Pattern[str]:
    """``zh``'s padded characters: sacrebleu's ``_is_chinese_char``, as one class.

    sacrebleu compares one character with each range's ends as strings, and two
    ends are two characters long (``'\\u20000'`` is U+2000 then "0"), so such a
    range starts just above its start's first character and ends at its end's
    first character. A test checks the class against ``_is_chinese_char`` on
    every code point.
    """
    spans = []
    for start, end in _UCODE_RANGES:
        lo = chr(ord(start[0]) + (len(start) > 1))
        spans.append(f"{re.escape(lo)}-{re.escape(end[0])}")
    return re.compile(f"([{''.join(spans)}])")


def _post(line: str) -> str:
    # sacrebleu's TokenizerRegexp: pad punctuation, then the context rules, then
    # single spaces.
    line = _pad(_PADDED, line)
    for pattern, template in _CONTEXT_RULES:
        line = pattern.sub(template, line)
    return " ".join(line.split())


def tokenize_13a(line: str) -> str:
    """sacrebleu's ``13a`` tokenizer (mteval-v13a), as one space-joined string.

    >>> tokenize_13a("Hello, world! It's 3.5-4 &amp; more.")
    "Hello , world ! It's 3.5 - 4 & more ."
    """
    line = line.replace("<skipped>", "").replace("-\n", "").replace("\n", " ")
    if "&" in line:
        line = line.replace("&quot;", '"').replace("&amp;", "&")
        line = line.replace("&lt;", "<").replace("&gt;", ">")
    return _post(f" {line} ")


def tokenize_zh(line: str) -> str:
    """sacrebleu's ``zh`` tokenizer: every Chinese character (its ranges) on its own,
    then ``13a``'s punctuation rules.

    >>> tokenize_zh("我喜欢猫。")
    '我 喜 欢 猫 。'
    """
    return _post(_pad(_zh_chars(), line.strip()))


_TOKENIZERS = {"13a": tokenize_13a, "zh": tokenize_zh}


@dataclass(frozen=True, slots=True)
class BleuNgrams:
    """One text's BLEU n-gram counts, by order (1 to 4), and its length in tokens."""

    by_order: tuple[Counter[tuple[str, ...]], ...]
    length: int


def pair_tokenizer(candidate: str, reference: str) -> str:
    """The tokenizer of a pair: ``zh`` when either text has CJK, else ``13a``.

    >>> pair_tokenizer("the cat", "the dog"), pair_tokenizer("the cat", "猫")
    ('13a', 'zh')
    """
    return "zh" if has_cjk(candidate) or has_cjk(reference) else "13a"


def ngrams(text: str, tokenizer: str) -> BleuNgrams:
    """The n-grams sacrebleu counts for ``text``: its tokenizer on the right-stripped
    text, then a whitespace split; one Counter per order.

    >>> g = ngrams("the cat sat", "13a")
    >>> g.length, [c.total() for c in g.by_order]
    (3, [3, 2, 1, 0])
    """
    tokens = _TOKENIZERS[tokenizer](text.rstrip()).split()
    by_order = tuple(
        Counter(zip(*(tokens[i:] for i in range(n)), strict=False)) for n in range(1, ORDER + 1)
    )
    return BleuNgrams(by_order, len(tokens))


def from_ngrams(candidate: BleuNgrams, reference: BleuNgrams) -> float:
    """Sentence BLEU in [0, 1] from two texts' n-grams.

    The statistics are sacrebleu's ``_compute_segment_statistics`` for one
    reference (matches clipped by the reference's count; the closest reference
    length is the only one), and the score is ``BLEU.compute_bleu`` with exp
    smoothing and the effective order.
    """
    correct = [0] * ORDER
    total = [0] * ORDER
    for n, (hyp, ref) in enumerate(zip(candidate.by_order, reference.by_order, strict=True)):
        total[n] = max(candidate.length - n, 0)
        # map() walks the shared n-grams in C; both walks see one list's order.
        shared = list(hyp.keys() & ref.keys())
        correct[n] = sum(map(min, map(hyp.__getitem__, shared), map(ref.__getitem__, shared)))
    score = BLEU.compute_bleu(
        correct,
        total,
        candidate.length,
        reference.length,
        smooth_method="exp",
        effective_order=True,
        max_ngram_order=ORDER,
    ).score
    # sacrebleu's exp(log(...)) lands on 100.00000000000004 for identical texts.
    return min(max(float(score) / 100.0, 0.0), 1.0)


def sentence_bleu(candidate: str, reference: str) -> float:
    """sacrebleu sentence BLEU in [0, 1]; ``zh`` tokenization when either text has CJK.

    Works on raw text, not our tokens, so the number is the one sacrebleu users know.

    Examples
    --------
    >>> sentence_bleu("the cat sat on the mat", "the cat sat on the mat")
    1.0
    """
    tokenizer = pair_tokenizer(candidate, reference)
    return from_ngrams(ngrams(candidate, tokenizer), ngrams(reference, tokenizer))
