"""The plain-text table ``quantdrift eval`` prints: one row per policy, padded columns."""

from __future__ import annotations

from collections.abc import Sequence


def text_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Cells left-aligned, each column as wide as its widest cell, two spaces apart.

    >>> print(text_table(("policy", "pairs"), [("default", "12"), ("seeds", "3")]))
    ... # doctest: +NORMALIZE_WHITESPACE
    policy   pairs
    default  12
    seeds    3
    """
    widths = [max(len(row[i]) for row in (header, *rows)) for i in range(len(header))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in (header, *rows)
    )
