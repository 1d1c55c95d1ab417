"""Reference computations the detectors are checked against: written the plain way,
apart from the code they check, and shared by the tests that need them."""

from __future__ import annotations

from collections.abc import Sequence


def lcs_table(a: Sequence[str], b: Sequence[str]) -> int:
    """The longest common subsequence's length by the textbook dynamic programme.

    >>> lcs_table("ABCBDAB", "BDCABA")
    4
    """
    row = [0] * (len(b) + 1)
    for x in a:
        prev_diag, row[0] = 0, 0
        for j, y in enumerate(b, 1):
            prev_diag, row[j] = row[j], prev_diag + 1 if x == y else max(row[j], row[j - 1])
    return row[-1]
