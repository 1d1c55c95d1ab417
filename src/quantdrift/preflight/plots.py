"""The launch page's charts as inline SVG (no script, no network, prints as drawn).

Each chart is drawn from its check's evidence in the report, and only when the
evidence is there: needle recall per context length x language (a grid, one
cell per length and language, red where the candidate misses the floor or
falls behind the reference by more than the tolerance), perplexity per domain,
the switch drill's timeline against its one-second bound, the load test's
latency and memory over time, the warm-up buckets. Pure: a report in, strings out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from html import escape
from typing import Any

_W, _H, _PAD, _TOP = 560, 250, 44, 46
PALETTE = ("#0969da", "#cf222e", "#8250df", "#1a7f37")
GOOD, BAD, MUTED = "#1a7f37", "#cf222e", "#9a6700"
# A case without a language is English: the built-in needles are English.
DEFAULT_LANGUAGE = "en"


def _scale(v: float, lo: float, hi: float, a: float, b: float) -> float:
    return a if hi == lo else a + (v - lo) * (b - a) / (hi - lo)


def _open(title: str, width: int = _W, height: int = _H) -> list[str]:
    return [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="{escape(title)}">',
        f'<text x="{width / 2}" y="16" text-anchor="middle" font-size="13">{escape(title)}</text>',
    ]


def line_chart(
    title: str,
    series: Mapping[str, Sequence[tuple[float, float]]],
    x_label: str,
    y_label: str,
    y_range: tuple[float, float] | None = None,
    points_only: bool = False,
) -> str:
    """An SVG chart of named (x, y) series; lines, or dots for scatter.

    Later series are dashed, so a line hidden under an identical one still shows.
    """
    xs = [x for s in series.values() for x, _ in s]
    ys = [y for s in series.values() for _, y in s]
    if not xs:
        return ""
    x0, x1 = min(xs), max(xs)
    y0, y1 = y_range or (min(0.0, min(ys)), max(ys) or 1.0)

    def px(x: float) -> float:
        return _scale(x, x0, x1, _PAD + 8, _W - 20)

    def py(y: float) -> float:
        return _scale(y, y0, y1, _H - _PAD, _TOP)

    parts = [
        *_open(title),
        f'<line x1="{_PAD}" y1="{_H - _PAD}" x2="{_W - 10}" y2="{_H - _PAD}" stroke="#888"/>',
        f'<line x1="{_PAD}" y1="{_TOP - 4}" x2="{_PAD}" y2="{_H - _PAD}" stroke="#888"/>',
        f'<text x="{_W / 2}" y="{_H - 8}" text-anchor="middle" font-size="11">'
        f"{escape(x_label)}</text>",
        f'<text x="12" y="{_H / 2}" font-size="11" transform="rotate(-90 12 {_H / 2})" '
        f'text-anchor="middle">{escape(y_label)}</text>',
    ]
    for v in (y0, (y0 + y1) / 2, y1):
        parts.append(
            f'<text x="{_PAD - 4}" y="{py(v) + 4:.1f}" font-size="10" text-anchor="end">'
            f"{v:.3g}</text>"
        )
    first = [x for x, _ in next((s for s in series.values() if s), [])]
    if points_only or len(first) > 8:  # a long series gets five even ticks, not one a point
        ticks = {x0 + (x1 - x0) * k / 4 for k in range(5)}
    else:
        ticks = {x0, x1, *first}
    for v in sorted(ticks):
        parts.append(
            f'<text x="{px(v):.1f}" y="{_H - _PAD + 14}" font-size="10" text-anchor="middle">'
            f"{v:.4g}</text>"
        )
    for i, (name, pts) in enumerate(series.items()):
        color = PALETTE[i % len(PALETTE)]
        coords = [(px(x), py(y)) for x, y in pts]
        if not points_only and len(coords) > 1:
            d = " ".join(f"{x:.1f},{y:.1f}" for x, y in coords)
            dash = ' stroke-dasharray="6 4"' if i else ""
            parts.append(
                f'<polyline fill="none" stroke="{color}" stroke-width="2"{dash} points="{d}"/>'
            )
        r = 2 if points_only else 3.5
        parts += [f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{r}" fill="{color}"/>' for x, y in coords]
        parts.append(
            f'<text x="{_PAD + 8 + 110 * i}" y="32" font-size="11" fill="{color}">'
            f"&#9632; {escape(name)}</text>"
        )
    parts.append("</svg>")
    return "".join(parts)


def evidence(report: Mapping[str, Any], cid: str, key: str) -> Any:
    """``evidence[key]`` of the check ``cid``; None when the check or its data is absent."""
    item = next((i for i in report["items"] if i["id"] == cid), None)
    return item["evidence"].get(key) if item else None


def _threshold(report: Mapping[str, Any], cid: str) -> Mapping[str, Any]:
    item = next((i for i in report["items"] if i["id"] == cid), None)
    return (item or {}).get("threshold") or {}


def columns(
    rows: Sequence[Mapping[str, Any]], x: str, ys: Mapping[str, str]
) -> dict[str, list[tuple[float, float]]]:
    """Named (x, y) series from table rows: ``{name: [(row[x], row[column]), ...]}``."""
    return {name: [(r[x], r[column]) for r in rows] for name, column in ys.items()}


# -- needle recall per length x language -----------------------------------------------


def needle_cells(report: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Recall per (language, length): from the per-case rows, else from the per-length table.

    >>> r = {"items": [{"id": "niah", "evidence": {"cases": [
    ...     {"length": 256, "candidate_hit": True, "reference_hit": True},
    ...     {"length": 256, "language": "zh", "candidate_hit": False, "reference_hit": True}]}}]}
    >>> [(c["language"], c["length"], c["candidate"], c["reference"]) for c in needle_cells(r)]
    [('en', 256, 1.0, 1.0), ('zh', 256, 0.0, 1.0)]
    """
    if cells := evidence(report, "niah", "by_cell"):
        return [dict(c) for c in cells]
    cases = evidence(report, "niah", "cases")
    if cases:
        groups: dict[tuple[str, int], list[Mapping[str, Any]]] = {}
        for c in cases:
            groups.setdefault((c.get("language") or DEFAULT_LANGUAGE, c["length"]), []).append(c)
        return [
            {
                "language": lang,
                "length": n,
                "candidate": sum(bool(c["candidate_hit"]) for c in g) / len(g),
                "reference": sum(bool(c["reference_hit"]) for c in g) / len(g),
                "cases": len(g),
            }
            for (lang, n), g in sorted(groups.items())
        ]
    rows = evidence(report, "niah", "by_length") or []
    return [{"language": DEFAULT_LANGUAGE, **r} for r in rows]


def cell_ok(cell: Mapping[str, Any], floor: float, tolerance: float) -> bool:
    """A cell passes at or over the floor and within the tolerance of the reference.

    >>> cell_ok({"candidate": 0.8, "reference": 1.0}, 0.75, 0.05)
    False
    >>> cell_ok({"candidate": 0.8, "reference": 0.8}, 0.75, 0.05)
    True
    """
    c, r = float(cell["candidate"]), float(cell["reference"])
    return c >= floor and c >= r - tolerance - 1e-12


def needle_grid(report: Mapping[str, Any]) -> str:
    cells = needle_cells(report)
    if not cells:
        return ""
    t = _threshold(report, "niah")
    floor, tol = float(t.get("floor", 0.0)), float(t.get("tolerance", 0.0))
    langs = sorted({c["language"] for c in cells})
    lengths = sorted({int(c["length"]) for c in cells})
    cw, ch, left, top = 96, 40, 64, 40
    width = max(_W, left + cw * len(lengths) + 20)
    height = top + ch * len(langs) + 44
    parts = _open("Needle recall per context length and language (candidate / reference)",
                  width, height)  # fmt: skip
    at = {(c["language"], int(c["length"])): c for c in cells}
    for j, n in enumerate(lengths):
        parts.append(
            f'<text x="{left + cw * j + cw / 2}" y="{top - 6}" font-size="11" '
            f'text-anchor="middle">{n:,} tokens</text>'
        )
    for i, lang in enumerate(langs):
        y = top + ch * i
        parts.append(
            f'<text x="{left - 8}" y="{y + ch / 2 + 4}" font-size="12" text-anchor="end">'
            f"{escape(lang)}</text>"
        )
        for j, n in enumerate(lengths):
            x = left + cw * j
            cell = at.get((lang, n))
            if cell is None:
                fill, text, state = "#f6f8fa", "not run", "not-run"
            else:
                ok = cell_ok(cell, floor, tol)
                fill, state = ("#dafbe1", "pass") if ok else ("#ffebe9", "fail")
                text = f"{cell['candidate'] * 100:.0f} % / {cell['reference'] * 100:.0f} %"
            parts.append(
                f'<rect class="cell" data-language="{escape(lang)}" data-length="{n}" '
                f'data-state="{state}" x="{x + 2}" y="{y + 2}" width="{cw - 4}" '
                f'height="{ch - 4}" fill="{fill}" stroke="#d0d7de"/>'
                f'<text x="{x + cw / 2}" y="{y + ch / 2 + 4}" font-size="12" '
                f'text-anchor="middle">{text}</text>'
            )
    parts.append(
        f'<text x="{left}" y="{height - 12}" font-size="11">red: candidate under the floor '
        f"{floor * 100:.0f} % or more than {tol * 100:.0f} points under the reference</text>"
    )
    parts.append("</svg>")
    return "".join(parts)


# -- perplexity per domain ------------------------------------------------------------


def bar_pairs(title: str, groups: Mapping[str, Mapping[str, float]], unit: str) -> str:
    """Horizontal bars, one group per label, one bar per series (candidate, reference)."""
    if not groups:
        return ""
    names = list(next(iter(groups.values())))
    top_v = max((v for g in groups.values() for v in g.values()), default=1.0) or 1.0
    bar, gap, left = 14, 12, 130
    height = 46 + len(groups) * (bar * len(names) + gap) + 10
    parts = _open(title, _W, height)
    for k, name in enumerate(names):
        parts.append(
            f'<text x="{left + 110 * k}" y="32" font-size="11" fill="{PALETTE[k]}">'
            f"&#9632; {escape(name)}</text>"
        )
    y = 44
    for label, g in groups.items():
        parts.append(
            f'<text x="{left - 6}" y="{y + bar * len(names) / 2 + 4}" font-size="11" '
            f'text-anchor="end">{escape(label)}</text>'
        )
        for k, name in enumerate(names):
            v = float(g.get(name, 0.0))
            w = _scale(v, 0, top_v, 0, _W - left - 80)
            parts.append(
                f'<rect x="{left}" y="{y}" width="{w:.1f}" height="{bar - 2}" '
                f'fill="{PALETTE[k]}"/><text x="{left + w + 4:.1f}" y="{y + bar - 4}" '
                f'font-size="10">{v:.3g}{escape(unit)}</text>'
            )
            y += bar
        y += gap
    parts.append("</svg>")
    return "".join(parts)


def perplexity_bars(report: Mapping[str, Any]) -> str:
    per = evidence(report, "perplexity", "per_domain") or {}
    groups = {d or "(no domain)": dict(v) for d, v in per.items()}
    return bar_pairs("Perplexity per domain (lower is better)", groups, "")


# -- switch drill timeline ------------------------------------------------------------


def drill_timeline(report: Mapping[str, Any]) -> str:
    """Each switch from its command (0) to issued and applied, against the bound."""
    switches = evidence(report, "switch-drill", "switches")
    if not switches:
        return ""
    bound = float(_threshold(report, "switch-drill").get("max_apply_s", 1.0))
    right = max([bound * 1.2] + [float(s.get("apply_s") or 0) * 1.1 for s in switches])
    left, lane = 90, 34
    height = 60 + lane * len(switches) + 24

    def px(t: float) -> float:
        return _scale(t, 0, right, left, _W - 30)

    parts = _open("Switch drill: command issued to applied by the gateway", _W, height)
    bx = px(bound)
    parts.append(
        f'<line x1="{bx:.1f}" y1="30" x2="{bx:.1f}" y2="{height - 28}" stroke="{BAD}" '
        f'stroke-dasharray="4 3"/><text x="{bx:.1f}" y="{height - 16}" font-size="10" '
        f'text-anchor="middle" fill="{BAD}">bound {bound:g} s</text>'
    )
    for i, s in enumerate(switches):
        y = 44 + lane * i
        applied, issued = s.get("apply_s"), s.get("cli_s")
        parts.append(
            f'<text x="{left - 6}" y="{y + 14}" font-size="12" text-anchor="end">'
            f"{escape(str(s.get('action')))}</text>"
        )
        if applied is None:
            parts.append(
                f'<text x="{left}" y="{y + 14}" font-size="11" fill="{BAD}">never applied</text>'
            )
            continue
        color = GOOD if applied < bound else BAD
        parts.append(
            f'<rect x="{left}" y="{y}" width="{px(applied) - left:.1f}" height="18" '
            f'fill="{color}" opacity="0.8"/>'
        )
        if isinstance(issued, int | float):
            parts.append(
                f'<line x1="{px(issued):.1f}" y1="{y - 2}" x2="{px(issued):.1f}" y2="{y + 20}" '
                f'stroke="#24292f"/>'
            )
        parts.append(
            f'<text x="{px(applied) + 4:.1f}" y="{y + 14}" font-size="11">applied at '
            f"{applied * 1000:.0f} ms"
            + (f" (command out at {issued * 1000:.0f} ms)" if isinstance(issued, int | float)
               else "") + "</text>"
        )  # fmt: skip
    parts.append("</svg>")
    return "".join(parts)


# -- load: latency and memory over time -----------------------------------------------


def load_latency(report: Mapping[str, Any]) -> str:
    pts = evidence(report, "load", "latency_series")
    if not pts:
        return ""
    latency = {
        "ok": [(t, lat) for t, lat, ok in pts if ok],
        "error": [(t, lat) for t, lat, ok in pts if not ok],
    }
    return line_chart(
        "Load test: latency over time",
        latency,
        "seconds since start",
        "latency (s)",
        points_only=True,
    )


def load_memory(report: Mapping[str, Any]) -> str:
    series = evidence(report, "load", "rss_series_mb") or {}
    every = evidence(report, "load", "rss_every_s")
    step = float(every) if isinstance(every, int | float) and every > 0 else 1.0
    lines = {n: [(k * step, v) for k, v in enumerate(s)] for n, s in series.items() if s}
    if not lines:
        return ""
    x_label = "seconds since start" if every else "sample"
    return line_chart("Load test: memory (RSS) over time", lines, x_label, "RSS (MB)")


def warmup_lines(report: Mapping[str, Any]) -> str:
    rows = evidence(report, "warmup", "rows")
    if not rows:
        return ""
    warm = columns(rows, "bucket", {"first": "first_s", "steady p50": "steady_p50_s"})
    return line_chart(
        "Warm-up: first request against steady p50",
        warm,
        "prompt bucket (tokens)",
        "latency (s)",
    )


CHARTS = {
    "niah": needle_grid,
    "perplexity": perplexity_bars,
    "switch-drill": drill_timeline,
    "load": lambda r: load_latency(r) + load_memory(r),
    "warmup": warmup_lines,
}


def chart(report: Mapping[str, Any], cid: str) -> str:
    """The chart(s) of one check, "" when it has none or left no data."""
    fn = CHARTS.get(cid)
    return fn(report) if fn else ""


def plots(report: Mapping[str, Any]) -> list[str]:
    """Every chart the report's evidence allows, in the launch order."""
    out = [needle_grid(report), perplexity_bars(report), warmup_lines(report),
           drill_timeline(report), load_latency(report), load_memory(report)]  # fmt: skip
    return [p for p in out if p]
