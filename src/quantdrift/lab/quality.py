"""Task quality of each variant against the reference, on the lab's own prompts.

Two scores that a user of the model would notice, independent of any
similarity metric:

* **JSON validity** (task ``json``): the output holds a JSON object, and it has
  every expected key. Lenient about wrapping, as a tolerant client would be:
  the first ``{...}`` object in the text is decoded (markdown fences and a
  trailing chatty sentence are forgiven); a truncated or malformed object is not.
* **Needle recall** (task ``needle``): the fact hidden in the long context
  (``prompts.Prompt.answer``) appears in the answer, case-insensitively.

Rows are per candidate precision (``int4-g64`` ...) for shadow pairs and
``noise`` for reference-vs-reference pairs; each row scores the candidate
side and the reference side of the same pairs, so the gap is the damage.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass

from quantdrift.data.prompts import PROMPTS
from quantdrift.detectors.lexical import needle_hit
from quantdrift.schemas import PairEvent

_NEEDLE_ANSWERS = {p.text: p.answer for p in PROMPTS if p.task == "needle" and p.answer}


def json_valid(text: str, expected_keys: Iterable[str] | None) -> bool:
    """True when ``text`` contains a JSON object with all ``expected_keys``.

    Examples
    --------
    >>> json_valid('```json\\n{"a": 1, "b": 2}\\n```', ["a", "b"])
    True
    >>> json_valid('{"a": 1', ["a"])
    False
    >>> json_valid('{"a": 1}', ["a", "b"])
    False
    """
    start = text.find("{")
    if start < 0:
        return False
    try:
        obj, _ = json.JSONDecoder().raw_decode(text[start:])
    except ValueError:
        return False
    return isinstance(obj, dict) and all(k in obj for k in (expected_keys or ()))


def needle_answer(pair: PairEvent) -> str | None:
    """The expected needle answer for a pair's prompt, if it is one of the lab's needles."""
    return _NEEDLE_ANSWERS.get(pair.request.prompt or "")


@dataclass(frozen=True, slots=True)
class QualityRow:
    variant: str
    pairs: int
    exact_match: float  # candidate text == reference text
    json_pairs: int
    json_valid: float | None  # candidate
    json_valid_ref: float | None
    needle_pairs: int
    needle_recall: float | None  # candidate
    needle_recall_ref: float | None

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def _rate(hits: list[bool]) -> float | None:
    return round(sum(hits) / len(hits), 4) if hits else None


def _group(pair: PairEvent) -> str:
    return "noise" if pair.kind == "noise" else (pair.candidate.precision or pair.label or "?")


def quality_by_variant(pairs: Iterable[PairEvent]) -> list[QualityRow]:
    """One row per candidate precision (and ``noise``), in first-seen order."""
    groups: dict[str, list[PairEvent]] = {}
    for p in pairs:
        groups.setdefault(_group(p), []).append(p)
    rows = []
    for name, group in groups.items():
        jc, jr, nc, nr = [], [], [], []
        for p in group:
            if p.request.task == "json" or p.request.expects_json:
                keys = p.request.expected_keys
                jc.append(json_valid(p.candidate.text, keys))
                jr.append(json_valid(p.reference.text, keys))
            answer = needle_answer(p) if p.request.task == "needle" else None
            if answer:
                nc.append(needle_hit(p.candidate.text, answer))
                nr.append(needle_hit(p.reference.text, answer))
        exact = [p.candidate.text == p.reference.text for p in group]
        rows.append(
            QualityRow(
                variant=name,
                pairs=len(group),
                exact_match=_rate(exact) or 0.0,
                json_pairs=len(jc),
                json_valid=_rate(jc),
                json_valid_ref=_rate(jr),
                needle_pairs=len(nc),
                needle_recall=_rate(nc),
                needle_recall_ref=_rate(nr),
            )
        )
    return rows


def format_table(rows: list[QualityRow]) -> str:
    """A plain-text table: candidate vs reference on the same pairs."""

    def pct(x: float | None) -> str:
        return "-" if x is None else f"{100 * x:.0f}%"

    header = (
        "variant",
        "pairs",
        "exact",
        "json n",
        "json cand",
        "json ref",
        "needle n",
        "needle cand",
        "needle ref",
    )
    body = [
        (
            r.variant,
            str(r.pairs),
            pct(r.exact_match),
            str(r.json_pairs),
            pct(r.json_valid),
            pct(r.json_valid_ref),
            str(r.needle_pairs),
            pct(r.needle_recall),
            pct(r.needle_recall_ref),
        )
        for r in rows
    ]
    widths = [max(len(row[i]) for row in (header, *body)) for i in range(len(header))]
    lines = [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in (header, *body)
    ]
    return "\n".join(lines)
