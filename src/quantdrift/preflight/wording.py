"""Each check's measured value and threshold in words and units, for people who sign.

The report keeps numbers (``measured``, ``threshold``: what a program compares);
the page says them as a reviewer reads them, e.g. "recall 83 % vs reference
83 % over 12 cases" against "floor 75 %, tolerance 5 points". One function per
check; a check without one (a newer check, an older report) falls back to
``key value`` pairs, never to a JSON dump. Pure.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

Words = tuple[str, str]  # (measured, threshold)


def pct(x: Any, digits: int = 0) -> str:
    """A share as a percentage with a space before the sign, as the team writes it.

    >>> pct(0.8333), pct(0.05, 1), pct(None)
    ('83 %', '5.0 %', '?')
    """
    if not isinstance(x, int | float) or not math.isfinite(x):
        return "?"
    return f"{x * 100:.{digits}f} %"


def points(x: Any) -> str:
    """A tolerance between two shares, in percentage points.

    >>> points(0.05), points(0.25)
    ('5 points', '25 points')
    """
    return f"{x * 100:.0f} points" if isinstance(x, int | float) else "?"


def secs(x: Any) -> str:
    """Seconds, as ms below one second.

    >>> secs(0.1234), secs(2.5), secs(None)
    ('123 ms', '2.50 s', '?')
    """
    if not isinstance(x, int | float) or not math.isfinite(x):
        return "?"
    return f"{x * 1000:.0f} ms" if abs(x) < 1 else f"{x:.2f} s"


def num(x: Any) -> str:
    """A number in a few significant digits (thousands grouped)."""
    if isinstance(x, bool) or not isinstance(x, int | float):
        return str(x)
    if isinstance(x, int):
        return f"{x:,}"
    return f"{x:.4g}"


def _on(flag: Any) -> str:
    return "on" if flag else "off"


def leakage(m: Mapping[str, Any], t: Mapping[str, Any]) -> Words:
    cov = m.get("domain_coverage") or {}
    domains = ", ".join(f"{d} {n}" for d, n in cov.items())
    measured = (
        f"{pct(m.get('ngram_overlap'), 1)} of evaluation n-grams seen in calibration; "
        f"{m.get('contaminated_items')} contaminated items, "
        f"{m.get('near_duplicates')} near-duplicates, {m.get('exact_duplicates')} exact duplicates"
        + (f"; calibration items per domain: {domains}" if domains else "")
    )
    threshold = (
        f"at most {t.get('max_contaminated', 0)} items with {pct(t.get('item_overlap'))} of "
        f"their n-grams seen ({t.get('n_words')} words, {t.get('n_cjk')} CJK characters); "
        f"at most {t.get('max_near_duplicates', 0)} near-duplicates "
        f"(Jaccard >= {t.get('near_duplicate_jaccard')}); "
        f">= {t.get('min_items_per_domain')} calibration item per domain"
    )
    return measured, threshold


def _bits(tensors: Any) -> str:
    if isinstance(tensors, str):
        return tensors
    if not tensors:
        return "none found"
    values = sorted({float(b) for b in tensors.values()})
    return "/".join(f"{b:g}" for b in values) + f" bits ({len(tensors)} tensors)"


def salient(m: Mapping[str, Any], t: Mapping[str, Any]) -> Words:
    quant = ", ".join(
        f"{k.replace('_', ' ')} {m[k]}"
        for k in ("quant_method", "quant_bits", "group_size")
        if m.get(k) is not None
    )
    measured = (
        f"{m.get('format')} checkpoint{f' ({quant})' if quant else ''}: embeddings "
        f"{_bits(m.get('embeddings'))}, lm_head {_bits(m.get('lm_head'))}, outlier layers "
        f"{_bits(m.get('outlier_layers'))}; {pct(m.get('share_high_precision'), 1)} of "
        f"{num(m.get('params'))} parameters at high precision"
    )
    threshold = f"protected tensors >= {num(t.get('min_bits'))} bits" + (
        f", >= {pct(t.get('min_share_high_precision'))} of parameters"
        if t.get("min_share_high_precision")
        else ""
    )
    return measured, threshold


def niah(m: Mapping[str, Any], t: Mapping[str, Any]) -> Words:
    lengths = ", ".join(f"{n:,}" for n in m.get("lengths") or [])
    context = m.get("context_length")
    langs = m.get("languages") or []
    measured = (
        f"recall {pct(m.get('candidate_recall'))} vs reference {pct(m.get('reference_recall'))} "
        f"over {m.get('cases')} cases at {lengths} tokens"
        + (f" in {', '.join(langs)}" if langs else "")
        + (f" (context {context:,} tokens)" if isinstance(context, int) else "")
        + (f"; {m['cells_below']} of {m['cells']} cells below" if m.get("cells") else "")
    )
    per = ", in every language x length cell" if t.get("per_cell") else ""
    return measured, f"floor {pct(t.get('floor'))}, tolerance {points(t.get('tolerance'))}{per}"


def scales(m: Mapping[str, Any], t: Mapping[str, Any]) -> Words:
    measured = (
        f"{m.get('scale_tensors')} scale tensors, {num(m.get('values'))} values from "
        f"{num(m.get('min'))} to {num(m.get('max'))}; {m.get('zeros')} zero, "
        f"{m.get('nans')} NaN, {m.get('infs')} Inf, {m.get('below_range')} below and "
        f"{m.get('above_range')} above the range"
    )
    return measured, f"every value in [{num(t.get('lo'))}, {num(t.get('hi'))}], none zero/NaN/Inf"


def warmup(m: Mapping[str, Any], t: Mapping[str, Any]) -> Words:
    buckets = m.get("buckets") or {}
    per = ", ".join(f"{b} tokens {num(r)}x" for b, r in buckets.items())
    measured = f"first request at worst {num(m.get('worst_ratio'))}x the steady p50 ({per})"
    return measured, f"at most {num(t.get('max_ratio'))}x the steady p50 in every bucket"


def memory(m: Mapping[str, Any], t: Mapping[str, Any]) -> Words:
    return (
        f"gpu_memory_utilization {num(m.get('gpu_memory_utilization'))}",
        f"between {t.get('lo')} and {t.get('hi')}",
    )


def shadow(m: Mapping[str, Any], t: Mapping[str, Any]) -> Words:
    rt = m.get("roundtrip_s")
    measured = (
        f"mirrors {pct(m.get('shadow_share'), 1)} of requests; scoring p99 "
        f"{num(m.get('scoring_p99_ms'))} ms (p50 {num(m.get('scoring_p50_ms'))} ms) over "
        f"{m.get('pairs_timed')} pairs with the {m.get('scorer')} scorer; "
        + (f"pair to ScoreEvent in {secs(rt)}" if rt is not None else "no ScoreEvent came back")
    )
    threshold = (
        f"mirror {pct(t.get('expected_share'), 1)}; scoring p99 under {num(t.get('p99_ms'))} ms; "
        f"a ScoreEvent within {num(t.get('roundtrip_timeout_s'))} s"
    )
    return measured, threshold


def probes(m: Mapping[str, Any], t: Mapping[str, Any]) -> Words:
    measured = (
        f"repetition probe {_on(m.get('repetition_probe'))}, entropy probe "
        f"{_on(m.get('entropy_probe'))}, JSON guard {_on(m.get('json_guard'))}, JSON whitespace "
        f"guard {_on(m.get('json_whitespace_guard'))}; stream hold-back "
        f"{m.get('stream_holdback_tokens')} tokens"
    )
    return measured, "all four on"


def drill(m: Mapping[str, Any], t: Mapping[str, Any]) -> Words:
    if "rollback_s" not in m:
        done = [f"{s.get('action')} {secs(s.get('apply_s'))}" for s in m.get("switches", [])]
        measured = "; ".join(done) or "no switch applied"
    else:
        measured = (
            f"rollback applied in {secs(m.get('rollback_s'))}, restore in "
            f"{secs(m.get('restore_s'))}; route "
            + ("left as found" if m.get("route_restored") else "NOT left as found")
        )
    return measured, f"each switch under {secs(t.get('max_apply_s'))}; the route left as found"


def load(m: Mapping[str, Any], t: Mapping[str, Any]) -> Words:
    rate, mult = m.get("rate_rps"), t.get("multiplier")
    peak = rate / mult if isinstance(rate, int | float) and mult else None
    rss = ", ".join(f"{n} {g * 100:+.0f} %" for n, g in (m.get("rss_growth") or {}).items())
    measured = (
        f"{m.get('requests')} requests at {num(rate)} req/s"
        + (f" ({num(mult)}x peak {num(peak)} req/s)" if peak else "")
        + f": {pct(m.get('error_rate'), 1)} errors, p50 {secs(m.get('p50_s'))}, "
        f"p99 {secs(m.get('p99_s'))}, longest stall {secs(m.get('longest_stall_s'))}"
        + (f"; memory (RSS) {rss}" if rss else "; memory not watched")
    )
    p99 = t.get("max_p99_s")
    threshold = (
        f"for {num(t.get('duration_s'))} s at {num(mult)}x peak: errors at most "
        f"{pct(t.get('max_error_rate'), 1)}, no stall of {num(t.get('stall_s'))} s, "
        f"no error burst, RSS growth at most {pct(t.get('max_rss_growth'))}"
        + (f", p99 at most {secs(p99)}" if p99 is not None else "")
    )
    return measured, threshold


def perplexity(m: Mapping[str, Any], t: Mapping[str, Any]) -> Words:
    measured = (
        f"perplexity {num(m.get('candidate'))} vs reference {num(m.get('reference'))} "
        f"({pct(m.get('rise'), 1)} rise) over {num(m.get('tokens'))} tokens of "
        f"{m.get('texts')} texts"
    )
    return measured, f"at most {pct(t.get('tolerance'))} above the reference"


WORDING: dict[str, Callable[[Mapping[str, Any], Mapping[str, Any]], Words]] = {
    "calibration-leakage": leakage,
    "salient-weights": salient,
    "niah": niah,
    "fp8-scales": scales,
    "warmup": warmup,
    "memory-utilization": memory,
    "shadow-link": shadow,
    "probes": probes,
    "switch-drill": drill,
    "load": load,
    "perplexity": perplexity,
}


def plain(d: Mapping[str, Any]) -> str:
    """``key value`` pairs for a check this module has no words for.

    >>> plain({"error_rate": 0.0, "lengths": [256, 1024], "nested": {"a": 1}})
    'error rate 0, lengths 256/1,024, nested (1 values)'
    """
    parts = []
    for k, v in d.items():
        if isinstance(v, list):
            text = "/".join(num(x) for x in v)
        elif isinstance(v, dict):
            text = f"({len(v)} values)"
        else:
            text = num(v)
        parts.append(f"{k.replace('_', ' ')} {text}")
    return ", ".join(parts)


def words(item: Mapping[str, Any]) -> Words:
    """(measured, threshold) of one report item, in words; ("", "") when it measured nothing.

    >>> words({"id": "niah", "measured": {"candidate_recall": 0.8333, "reference_recall":
    ...        0.8333, "cases": 12, "lengths": [256, 1024], "context_length": None},
    ...        "threshold": {"floor": 0.75, "tolerance": 0.05}})
    ('recall 83 % vs reference 83 % over 12 cases at 256, 1,024 tokens', 'floor 75 %, tolerance 5 points')
    """  # noqa: E501
    m, t = item.get("measured") or {}, item.get("threshold") or {}
    if not m:
        return "", plain(t)
    fn = WORDING.get(str(item.get("id")))
    if fn is None:
        return plain(m), plain(t)
    try:
        return fn(m, t)
    except (KeyError, TypeError, ValueError, AttributeError):
        # A report from another version with other fields: still readable, never a crash.
        return plain(m), plain(t)
