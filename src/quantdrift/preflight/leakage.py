"""``calibration-leakage``: the calibration set must not overlap the evaluation set.

A quantizer calibrated on the very prompts the launch is judged on flatters
itself, so three things are measured (all pure; ``load_texts`` is the only I/O):

* **n-gram overlap**: the share of each evaluation text's n-grams found in the
  calibration set. Tokens come from ``detectors.tokenize``, where every CJK
  character is a token, so on Chinese the n-grams are *character* n-grams
  (``n_cjk``, 5 by default: Chinese words are 1-3 characters) and on Latin
  scripts word n-grams (``n_words``, 8 by default, short enough to catch
  paraphrase-free reuse, long enough to ignore stock phrases).
* **near-duplicates**: Jaccard similarity of character 5-gram shingles of the
  whitespace-normalised text, via an inverted index so it is not all-pairs.
* **domain coverage**: how many calibration items carry each declared domain
  (``domain`` field or ``tags``), e.g. catalog, coupon rules, support Q&A. A
  declared domain with no calibration item means the quantizer never saw it.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from quantdrift.detectors.tokenize import has_cjk, tokenize
from quantdrift.errors import ConfigError

_SPACE = re.compile(r"\s+")
_TEXT_FIELDS = ("text", "prompt", "question", "input", "completion", "answer", "output")


@dataclass(frozen=True, slots=True)
class TextItem:
    text: str
    domains: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class LeakageThresholds:
    n_words: int = 8
    n_cjk: int = 5
    item_overlap: float = 0.5  # an eval item with this share of seen n-grams is contaminated
    near_duplicate: float = 0.8  # Jaccard of char 5-gram shingles
    max_contaminated: int = 0
    max_near_duplicates: int = 0
    min_items_per_domain: int = 1


@dataclass(slots=True)
class LeakageResult:
    eval_items: int
    calibration_items: int
    ngram_overlap: float  # share of all eval n-grams seen in calibration
    contaminated: list[dict[str, Any]] = field(default_factory=list)
    near_duplicates: list[dict[str, Any]] = field(default_factory=list)
    exact_duplicates: int = 0
    coverage: dict[str, int] = field(default_factory=dict)
    uncovered: list[str] = field(default_factory=list)


def ngrams(text: str, n_words: int = 8, n_cjk: int = 5) -> set[tuple[str, ...]]:
    """Word n-grams, or character n-grams when the text has CJK.

    A text shorter than n yields itself as one gram, so short items still compare.

    >>> sorted(ngrams("a b c d", n_words=3))
    [('a', 'b', 'c'), ('b', 'c', 'd')]
    >>> len(ngrams("优惠券满一百减二十", n_cjk=5))  # 9 characters -> 5 character 5-grams
    5
    """
    tokens = tokenize(text)
    n = n_cjk if has_cjk(text) else n_words
    if not tokens:
        return set()
    if len(tokens) < n:
        return {tuple(tokens)}
    return {tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)}


def normalise(text: str) -> str:
    return _SPACE.sub(" ", unicodedata.normalize("NFKC", text).casefold()).strip()


def shingles(text: str, k: int = 5) -> set[str]:
    """Character k-shingles of the normalised text (script-agnostic near-duplicate key).

    >>> sorted(shingles("abcdef", 5))
    ['abcde', 'bcdef']
    """
    t = normalise(text)
    if len(t) <= k:
        return {t} if t else set()
    return {t[i : i + k] for i in range(len(t) - k + 1)}


def measure(
    calibration: Sequence[TextItem],
    evaluation: Sequence[TextItem],
    domains: Sequence[str] = (),
    t: LeakageThresholds = LeakageThresholds(),
) -> LeakageResult:
    """Overlap, near-duplicates and coverage of ``calibration`` against ``evaluation``."""
    calib_grams: set[tuple[str, ...]] = set()
    for item in calibration:
        calib_grams |= ngrams(item.text, t.n_words, t.n_cjk)
    index: dict[str, list[int]] = defaultdict(list)
    calib_sh: list[set[str]] = []
    for i, item in enumerate(calibration):
        sh = shingles(item.text)
        calib_sh.append(sh)
        for s in sh:
            index[s].append(i)
    calib_exact = {normalise(i.text) for i in calibration}

    seen_total = grams_total = 0
    result = LeakageResult(len(evaluation), len(calibration), 0.0)
    for j, item in enumerate(evaluation):
        grams = ngrams(item.text, t.n_words, t.n_cjk)
        seen = len(grams & calib_grams)
        seen_total += seen
        grams_total += len(grams)
        share = seen / len(grams) if grams else 0.0
        if grams and share >= t.item_overlap:
            result.contaminated.append(
                {"eval_index": j, "overlap": round(share, 4), "text": item.text[:120]}
            )
        if normalise(item.text) in calib_exact:
            result.exact_duplicates += 1
        sh = shingles(item.text)
        shared: Counter[int] = Counter()
        for s in sh:
            shared.update(index.get(s, ()))
        best, best_i = 0.0, -1
        for i, n_shared in shared.items():
            jac = n_shared / (len(sh) + len(calib_sh[i]) - n_shared)
            if jac > best:
                best, best_i = jac, i
        if best >= t.near_duplicate:
            result.near_duplicates.append(
                {"eval_index": j, "calibration_index": best_i, "jaccard": round(best, 4)}
            )
    result.ngram_overlap = seen_total / grams_total if grams_total else 0.0
    counts: Counter[str] = Counter()
    for item in calibration:
        counts.update(item.domains)
    result.coverage = {d: counts.get(d, 0) for d in domains}
    result.uncovered = [d for d in domains if counts.get(d, 0) < t.min_items_per_domain]
    return result


def leakage_ok(r: LeakageResult, t: LeakageThresholds) -> tuple[bool, str]:
    """(ok, why) for a measured result."""
    problems = []
    if len(r.contaminated) > t.max_contaminated:
        problems.append(f"{len(r.contaminated)} eval items share >= {t.item_overlap:.0%} n-grams")
    if len(r.near_duplicates) > t.max_near_duplicates:
        problems.append(f"{len(r.near_duplicates)} near-duplicates (Jaccard >= {t.near_duplicate})")
    if r.uncovered:
        problems.append(f"domains without calibration data: {', '.join(r.uncovered)}")
    if not problems:
        return True, f"no overlap found; n-gram overlap {r.ngram_overlap:.2%}"
    return False, "; ".join(problems)


def item_from_record(record: Any) -> TextItem:
    """A TextItem from a JSON record (text fields, chat ``messages``) or a bare string."""
    if isinstance(record, str):
        return TextItem(record)
    if not isinstance(record, dict):
        raise ConfigError(f"expected an object or a string, got {type(record).__name__}")
    parts = [str(record[k]) for k in _TEXT_FIELDS if isinstance(record.get(k), str)]
    for m in record.get("messages") or ():
        if isinstance(m, dict) and isinstance(m.get("content"), str):
            parts.append(m["content"])
    domains: set[str] = set()
    if isinstance(record.get("domain"), str):
        domains.add(record["domain"])
    tags = record.get("tags")
    if isinstance(tags, list):
        domains.update(str(x) for x in tags)
    return TextItem("\n".join(parts), frozenset(domains))


def load_texts(path: Path) -> list[TextItem]:
    """JSONL (one record a line), a JSON list, or plain text (one item a line)."""
    try:
        raw = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror or exc}") from exc
    if path.suffix == ".json":
        data = json.loads(raw)
        if not isinstance(data, list):
            raise ConfigError(f"{path}: expected a JSON list")
        return [item_from_record(r) for r in data]
    if path.suffix == ".jsonl":
        out = []
        for n, line in enumerate(raw.splitlines(), 1):
            if line.strip():
                try:
                    out.append(item_from_record(json.loads(line)))
                except ValueError as exc:
                    raise ConfigError(f"{path}:{n}: invalid JSON: {exc}") from exc
        return out
    return [TextItem(line) for line in raw.splitlines() if line.strip()]


def items(texts: Iterable[str]) -> list[TextItem]:
    return [TextItem(t) for t in texts]
