# ruff: noqa: E501
"""The report as one self-contained HTML page (inline SVG, no script, no network).

Plots where a person would rather look than read: needle recall by context
length (candidate against reference) and latency over time under load; the
warm-up buckets as cold-vs-steady bars. Everything else is the item table.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from html import escape
from typing import Any

_COLORS = {"pass": "#1a7f37", "fail": "#cf222e", "skipped": "#9a6700"}
_W, _H, _PAD, _TOP = 560, 250, 44, 46


def _scale(v: float, lo: float, hi: float, a: float, b: float) -> float:
    return a if hi == lo else a + (v - lo) * (b - a) / (hi - lo)


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
    palette = ["#0969da", "#cf222e", "#8250df", "#1a7f37"]

    def px(x: float) -> float:
        return _scale(x, x0, x1, _PAD + 8, _W - 20)

    def py(y: float) -> float:
        return _scale(y, y0, y1, _H - _PAD, _TOP)

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{_W}" height="{_H}" '
        f'role="img" aria-label="{escape(title)}">',
        f'<text x="{_W / 2}" y="16" text-anchor="middle" font-size="13">{escape(title)}</text>',
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
    ticks = {x0, x1} if points_only else {x0, x1, *(x for x, _ in next(iter(series.values())))}
    for v in sorted(ticks):
        parts.append(
            f'<text x="{px(v):.1f}" y="{_H - _PAD + 14}" font-size="10" text-anchor="middle">'
            f"{v:.4g}</text>"
        )
    for i, (name, pts) in enumerate(series.items()):
        color = palette[i % len(palette)]
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


def _evidence(report: Mapping[str, Any], cid: str, key: str) -> Any:
    """``evidence[key]`` of the check ``cid``; None when the check or its data is absent."""
    item = next((i for i in report["items"] if i["id"] == cid), None)
    return item["evidence"].get(key) if item else None


def _columns(
    rows: Sequence[Mapping[str, Any]], x: str, ys: Mapping[str, str]
) -> dict[str, list[tuple[float, float]]]:
    """Named (x, y) series from table rows: ``{name: [(row[x], row[column]), ...]}``."""
    return {name: [(r[x], r[column]) for r in rows] for name, column in ys.items()}


def plots(report: Mapping[str, Any]) -> list[str]:
    """The charts whose checks left their data: needle recall, latency, warm-up."""
    out = []
    if rows := _evidence(report, "niah", "by_length"):
        recall = _columns(rows, "length", {"candidate": "candidate", "reference": "reference"})
        title, x_label = "Needle recall by context length", "haystack length (tokens, nominal)"
        out.append(line_chart(title, recall, x_label, "recall", (0.0, 1.0)))
    if pts := _evidence(report, "load", "latency_series"):
        latency = {
            "ok": [(t, lat) for t, lat, ok in pts if ok],
            "error": [(t, lat) for t, lat, ok in pts if not ok],
        }
        title, x_label = "Latency over time under load", "seconds since start"
        out.append(line_chart(title, latency, x_label, "latency (s)", points_only=True))
    if rows := _evidence(report, "warmup", "rows"):
        warm = _columns(rows, "bucket", {"first": "first_s", "steady p50": "steady_p50_s"})
        title, x_label = "Warm-up: first request against steady p50", "prompt bucket (tokens)"
        out.append(line_chart(title, warm, x_label, "latency (s)"))
    return [p for p in out if p]


def _short(d: Mapping[str, Any]) -> str:
    text = json.dumps(d, ensure_ascii=False)
    return escape(text if len(text) < 400 else text[:400] + "…")


def render(report: Mapping[str, Any]) -> str:
    verdict = report["verdict"]
    color = "#1a7f37" if verdict == "go" else "#cf222e"
    rows = []
    for it in report["items"]:
        why = it["evidence"].get("why") or it["evidence"].get("reason") or ""
        rows.append(
            f"<tr><td><code>{escape(it['id'])}</code></td><td>{escape(it['title'])}</td>"
            f'<td style="color:{_COLORS[it["status"]]};font-weight:bold">{it["status"]}</td>'
            f"<td>{escape(str(why))}</td><td><small>{_short(it['measured'])}</small></td>"
            f"<td><small>{_short(it['threshold'])}</small></td></tr>"
        )
    vetoes = "".join(
        f"<li><b>{escape(v['id'])}</b>: {escape(v['reason'])}</li>" for v in report["vetoes"]
    )
    blocking = "".join(f"<li>{escape(b)}</li>" for b in report.get("blocking", []))
    subject = escape(json.dumps(report.get("subject", {}), ensure_ascii=False))
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>quantdrift preflight: {verdict}</title>
<style>body{{font:14px system-ui,sans-serif;margin:2em;max-width:1100px}}
table{{border-collapse:collapse}}td,th{{border-bottom:1px solid #ddd;padding:4px 8px;vertical-align:top;text-align:left}}
.verdict{{font-size:28px;color:{color};font-weight:bold}}svg{{margin:8px 16px 8px 0;border:1px solid #eee}}</style>
</head><body>
<h1>quantdrift preflight</h1>
<p class="verdict">{verdict}</p>
<p><small>{subject}</small></p>
{"<h2>Vetoes</h2><ul>" + vetoes + "</ul>" if vetoes else ""}
{"<h2>Blocking</h2><ul>" + blocking + "</ul>" if blocking else ""}
<div>{"".join(plots(report))}</div>
<h2>Checks</h2>
<table><tr><th>id</th><th>check</th><th>status</th><th>why</th><th>measured</th><th>threshold</th></tr>
{"".join(rows)}
</table>
<p><small>A skipped check is never a pass. Full evidence: the JSON report.</small></p>
</body></html>
"""
