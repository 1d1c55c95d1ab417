"""One CJK-aware tokenizer shared by every lexical and repetition metric.

Why one: every metric of a pair must agree on what a "token" is, and a pair's
texts are tokenized once and the token lists reused (tokenizing is the largest
pure-Python cost of the lexical suite).

Rules:

* lowercase;
* in alphabetic scripts a token is a run of letters/digits (and combining marks,
  so "cafe\u0301" or Devanagari stay one word); everything else separates;
* every CJK ideograph, kana and hangul syllable is its own token: Chinese and
  Japanese have no spaces, and a run of ideographs as one "word" would make
  ROUGE all-or-nothing on a whole sentence;
* punctuation, symbols, emoji and whitespace are dropped.

On ASCII input this is exactly rouge-score's default tokenizer (lowercase, runs
of ``[a-z0-9]``; ``_`` separates), so ROUGE here equals rouge-score on English.
Non-ASCII text is NFKC-normalized first, so full-width ``ＡＢＣ１２`` reads as
``abc12``.
"""

from __future__ import annotations

import re
import unicodedata

# Han (BMP, extension A, compatibility, supplementary planes), kana (incl.
# half-width and phonetic extensions), hangul (syllables, jamo, compatibility jamo).
_CJK_RANGES = (
    "\u1100-\u11ff"
    "\u3040-\u309f\u30a0-\u30ff\u31f0-\u31ff"
    "\u3130-\u318f"
    "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
    "\uac00-\ud7af"
    "\uff66-\uff9f"
    "\U00020000-\U0003134f"
)
# Combining marks that Python's ``\w`` does not count as word characters but that
# belong inside a word (Latin diacritics, Indic and Thai vowel signs, Hebrew and
# Arabic points).
_MARKS = (
    "\u0300-\u036f\u0483-\u0489\u0591-\u05bd\u05bf-\u05c7\u0610-\u061a\u064b-\u065f"
    "\u0670\u06d6-\u06ed\u0900-\u0963\u0966-\u0dff\u0e31-\u0e3a\u0e47-\u0e4e"
    "\u1ab0-\u1aff\u1dc0-\u1dff\u20d0-\u20ff\ufe20-\ufe2f"
)
_CJK_CHAR = re.compile(f"[{_CJK_RANGES}]")
# A single CJK character, or a run of word characters that are neither "_" nor CJK.
_TOKEN = re.compile(f"[{_CJK_RANGES}]|(?:[^\\W_{_CJK_RANGES}]|[{_MARKS}])+")
_ASCII_TOKEN = re.compile(r"[a-z0-9]+")


def tokenize(text: str) -> list[str]:
    """Split ``text`` into lowercase word tokens; each CJK character is one token.

    Examples
    --------
    >>> tokenize("The cat's hat -- 2 times!")
    ['the', 'cat', 's', 'hat', '2', 'times']
    >>> tokenize("我喜欢猫 (cats) ですね")
    ['我', '喜', '欢', '猫', 'cats', 'で', 'す', 'ね']
    >>> tokenize("")
    []
    """
    if text.isascii():
        # Fast path, and the exact rouge-score rule.
        return _ASCII_TOKEN.findall(text.lower())
    return _TOKEN.findall(unicodedata.normalize("NFKC", text).lower())


def has_cjk(text: str) -> bool:
    """True when ``text`` contains a CJK ideograph, kana or hangul character.

    Chooses sacrebleu's ``zh`` tokenizer over ``13a`` for BLEU.

    Examples
    --------
    >>> has_cjk("hello"), has_cjk("hello 世界"), has_cjk("안녕")
    (False, True, True)
    """
    return not text.isascii() and _CJK_CHAR.search(text) is not None
