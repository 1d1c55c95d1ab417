"""Degeneration signals of one text: repeated n-gram runs, a looping tail, low
bigram diversity, runaway whitespace.

Quantization failures look like this far more often than like fluent wrong
answers: a model that falls into a loop repeats a word or a sentence until
``max_tokens``. All of it works on integer token ids with numpy so a 2,000-token
loop costs the same handful of vector operations as a 20-token answer.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

MAX_NGRAM = 8
# A looping tail: at least this many consecutive copies of a unit ...
LOOP_MIN_COPIES = 3
# ... of at most this many tokens ...
LOOP_MAX_PERIOD = 64
# ... covering at least LOOP_TAIL_SHARE of the last LOOP_TAIL_WINDOW tokens
# (of the whole text if shorter), and at least LOOP_MIN_TOKENS tokens.
LOOP_TAIL_WINDOW = 64
LOOP_TAIL_SHARE = 0.5
LOOP_MIN_TOKENS = 8

_WHITESPACE_RUN = re.compile(r"\s+")

IntArray = npt.NDArray[np.int64]


def token_ids(tokens: Sequence[str]) -> IntArray:
    """Map tokens to dense integer ids (first occurrence order), for vector work."""
    vocab: dict[str, int] = {}
    return np.fromiter(
        (vocab.setdefault(t, len(vocab)) for t in tokens), dtype=np.int64, count=len(tokens)
    )


def _longest_true_run(flags: npt.NDArray[np.bool_]) -> int:
    if not flags.any():
        return 0
    padded = np.concatenate(([0], flags.view(np.int8), [0]))
    edges = np.flatnonzero(np.diff(padded))
    return int((edges[1::2] - edges[::2]).max())


def repetition_run(ids: IntArray, max_n: int = MAX_NGRAM) -> int:
    """The most consecutive copies of any n-gram, n in 1..max_n (0 for no tokens).

    A stretch of ``c`` consecutive copies of an n-gram is a stretch where each
    token equals the one ``n`` before it for ``(c - 1) * n`` positions, so each n
    is one vectorized comparison and a longest-run search.

    Examples
    --------
    >>> from quantdrift.detectors.tokenize import tokenize
    >>> repetition_run(token_ids(tokenize("I think so. I think so. I think so. Yes.")))
    3
    >>> repetition_run(token_ids(tokenize("no no no no no")))
    5
    >>> repetition_run(token_ids(tokenize("a plain sentence")))
    1
    """
    n_tokens = len(ids)
    if n_tokens == 0:
        return 0
    best = 1
    for n in range(1, min(max_n, n_tokens // 2) + 1):
        run = _longest_true_run(ids[n:] == ids[:-n])
        best = max(best, run // n + 1)
    return best


def looping(ids: IntArray) -> bool:
    """True when the text ends in a loop.

    Precisely: for some period ``p`` in 1..64 the last ``r`` tokens are periodic
    with period ``p`` (each equals the token ``p`` before it), with

    * ``r >= 3 * p`` — at least three consecutive full copies of the unit,
    * ``r >= 8`` — not a short "no, no, no",
    * ``r >= 0.5 * min(n, 64)`` — the loop fills at least half of the tail
      (of the last 64 tokens, or of the whole text when it is shorter).

    So a long answer that degenerates into its last 32+ tokens loops; a list
    whose items share a prefix does not (the tail is not periodic).

    Examples
    --------
    >>> from quantdrift.detectors.tokenize import tokenize
    >>> looping(token_ids(tokenize("Answer: 42. " + "I am sorry. " * 6)))
    True
    >>> looping(token_ids(tokenize("ha ha ha")))  # too short to call a loop
    False
    >>> looping(token_ids(tokenize("one two three four five six seven eight nine")))
    False
    """
    n = len(ids)
    if n < LOOP_MIN_TOKENS:
        return False
    need = max(LOOP_MIN_TOKENS, LOOP_TAIL_SHARE * min(n, LOOP_TAIL_WINDOW))
    max_period = min(LOOP_MAX_PERIOD, n // LOOP_MIN_COPIES)
    if max_period < 1:
        return False
    # Only periods whose unit ends like the text does can loop: one vector test.
    lookback = ids[n - 1 - max_period : n - 1][::-1]
    for p in np.flatnonzero(lookback == ids[-1]) + 1:
        same = ids[p:] == ids[:-p]
        tail = same[::-1]
        matched = int(np.argmin(tail)) if not tail.all() else len(tail)
        r = matched + int(p)
        if r >= LOOP_MIN_COPIES * p and r >= need:
            return True
    return False


def distinct_2(ids: IntArray) -> float | None:
    """Unique bigrams / bigrams; None for fewer than two tokens.

    Examples
    --------
    >>> from quantdrift.detectors.tokenize import tokenize
    >>> distinct_2(token_ids(tokenize("a b a b a")))  # ab ba ab ba: 2 unique of 4
    0.5
    """
    if len(ids) < 2:
        return None
    # Pair each bigram into one int64 (ids < len(ids), so no overflow below 2**31 tokens),
    # and count the distinct ones with a set: a sort (np.unique) costs more on short texts.
    codes = ids[:-1] * (int(ids.max()) + 1) + ids[1:]
    return len(set(codes.tolist())) / len(codes)


def whitespace_run(text: str) -> int:
    """Length of the longest run of whitespace characters (0 for none).

    Examples
    --------
    >>> whitespace_run("a  b\\n\\n\\n\\nc"), whitespace_run("a b"), whitespace_run("")
    (4, 1, 0)
    """
    return max(map(len, _WHITESPACE_RUN.findall(text)), default=0)
