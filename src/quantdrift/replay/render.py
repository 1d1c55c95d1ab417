"""Write a replay report: one self-contained HTML file (inline SVG plots), CSV, Parquet.

The plots are hand-drawn SVG, not matplotlib: the report then needs no
optional dependency, opens offline, and its numbers are in the markup
(tests read them back). Parquet needs pyarrow (``pip install quantdrift[report]``).
"""

from __future__ import annotations

import csv
import html
import json
from collections.abc import Sequence
from pathlib import Path

from quantdrift.errors import ConfigError
from quantdrift.replay.core import QUANTILES, SCORE_COLUMNS, ReplayReport, RouteReport
from quantdrift.schemas.score import DivergentToken

W, H, PAD = 720, 200, 32


def _esc(x: object) -> str:
    return html.escape(str(x), quote=True)


def _fmt(x: float | None) -> str:
    return "–" if x is None else f"{x:.3f}"


def similarity_svg(rep: RouteReport, threshold: float | None = None) -> str:
    """Similarity per shadow pair, trips as red vertical lines (``data-trip`` = index)."""
    pts = rep.similarity
    if not pts:
        return "<p>no similarity values</p>"
    n = max(i for i, _ in pts)
    lo = min(0.0, min(v for _, v in pts))

    def x(i: float) -> float:
        return PAD + (W - 2 * PAD) * ((i - 1) / max(n - 1, 1))

    def y(v: float) -> float:
        return H - PAD - (H - 2 * PAD) * ((v - lo) / max(1.0 - lo, 1e-9))

    path = " ".join(f"{x(i):.1f},{y(v):.1f}" for i, v in pts)
    parts = [
        f'<svg class="sim" xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
        f'viewBox="0 0 {W} {H}" role="img" aria-label="similarity over time">',
        f'<rect x="0" y="0" width="{W}" height="{H}" fill="#fff"/>',
        f'<line x1="{PAD}" y1="{H - PAD}" x2="{W - PAD}" y2="{H - PAD}" stroke="#999"/>',
        f'<text x="{PAD}" y="{H - 8}" font-size="11">pair 1</text>',
        f'<text x="{W - PAD - 60}" y="{H - 8}" font-size="11">pair {n}</text>',
        f'<text x="2" y="{y(1.0) + 4:.1f}" font-size="10">1.0</text>',
        f'<text x="2" y="{y(lo) + 4:.1f}" font-size="10">{lo:.1f}</text>',
    ]
    if threshold is not None:
        parts.append(
            f'<line class="threshold" x1="{PAD}" x2="{W - PAD}" y1="{y(threshold):.1f}" '
            f'y2="{y(threshold):.1f}" stroke="#e69f00" stroke-dasharray="4 3"/>'
        )
    parts.append(f'<polyline fill="none" stroke="#0072b2" stroke-width="1.2" points="{path}"/>')
    for t in rep.trips:
        colour = "#d55e00" if t.to_state == "open" else "#009e73"
        parts.append(
            f'<line class="trip" data-trip="{t.index}" data-rule="{_esc(t.rule)}" '
            f'x1="{x(t.index):.1f}" x2="{x(t.index):.1f}" y1="{PAD}" y2="{H - PAD}" '
            f'stroke="{colour}" stroke-width="1.5"><title>{_esc(t.rule)} at pair {t.index}: '
            f"{_esc(t.reason)}</title></line>"
        )
    parts.append("</svg>")
    return "".join(parts)


def histogram_svg(
    name: str, shadow: Sequence[float], noise: Sequence[float], bins: int = 24
) -> str:
    """Shadow-pair histogram (blue) with the noise floor's histogram overlaid (grey)."""
    values = [*shadow, *noise]
    if not values:
        return ""
    lo, hi = min(values), max(values)
    if hi - lo < 1e-9:
        lo, hi = lo - 0.5, hi + 0.5
    w, h = 340, 150

    def counts(vals: Sequence[float]) -> list[int]:
        c = [0] * bins
        for v in vals:
            c[min(bins - 1, int((v - lo) / (hi - lo) * bins))] += 1
        return c

    cs, cn = counts(shadow), counts(noise)
    # Each series scaled to its own total, so the shapes compare whatever the counts.
    peak = max(
        max((c / max(len(shadow), 1) for c in cs), default=0),
        max((c / max(len(noise), 1) for c in cn), default=0),
        1e-9,
    )
    bw = (w - 2 * 10) / bins
    parts = [
        f'<svg class="hist" data-metric="{_esc(name)}" xmlns="http://www.w3.org/2000/svg" '
        f'width="{w}" height="{h}" viewBox="0 0 {w} {h}">',
        f'<text x="10" y="14" font-size="12">{_esc(name)}</text>',
    ]
    for series, total, cls, colour in (
        (cn, len(noise), "noise", "#999999"),
        (cs, len(shadow), "shadow", "#0072b2"),
    ):
        for i, c in enumerate(series):
            if not c:
                continue
            bh = (h - 40) * (c / max(total, 1)) / peak
            parts.append(
                f'<rect class="{cls}" x="{10 + i * bw:.1f}" y="{h - 20 - bh:.1f}" '
                f'width="{bw - 1:.1f}" height="{bh:.1f}" fill="{colour}" fill-opacity="0.55"/>'
            )
    parts.append(f'<text x="10" y="{h - 5}" font-size="10">{lo:.2f}</text>')
    parts.append(f'<text x="{w - 50}" y="{h - 5}" font-size="10">{hi:.2f}</text>')
    parts.append("</svg>")
    return "".join(parts)


CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:2em;color:#222}
table{border-collapse:collapse;margin:.5em 0 1.5em}
td,th{border:1px solid #ddd;padding:3px 8px;text-align:right}
th{background:#f4f4f4} td.l,th.l{text-align:left}
.false{color:#d55e00;font-weight:bold} .hists{display:flex;flex-wrap:wrap;gap:8px}
"""


def render_html(report: ReplayReport) -> str:
    """The whole report as one HTML string (no external assets)."""
    out = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        "<title>quantdrift replay</title>",
        f"<style>{CSS}</style></head><body>",
        "<h1>quantdrift replay</h1>",
        f"<p>source: {_esc(report.source)} · {report.total_scores} scores · "
        f"{len(report.routes)} route(s) · no commands or alerts were sent</p>",
        "<details><summary>policy</summary><pre>"
        + _esc(json.dumps(report.policy.model_dump(mode="json"), indent=2))
        + "</pre></details>",
    ]
    for route, rep in sorted(report.routes.items()):
        policy = report.policy.for_route(route)
        out.append(f'<section class="route" data-route="{_esc(route)}"><h2>{_esc(route)}</h2>')
        out.append(
            f"<p>shadow pairs <b class='shadow-pairs'>{rep.shadow_pairs}</b> · "
            f"noise pairs <b>{rep.noise_pairs}</b> · verdicts "
            f"{_esc(json.dumps(rep.verdicts, sort_keys=True))} · rollbacks judged against "
            f"labels <b>{rep.labelled_rollbacks}</b>, false rollbacks "
            f"<b class='false-rollbacks'>{rep.false_rollbacks}</b></p>"
        )
        out.append(similarity_svg(rep, policy.similarity_threshold))
        out.append("<h3>transitions</h3>")
        if rep.trips:
            out.append(
                "<table class='trips'><tr><th>pair #</th><th class='l'>pair id</th>"
                "<th class='l'>rule</th><th class='l'>transition</th><th>epoch</th>"
                "<th class='l'>false rollback</th><th class='l'>reason</th></tr>"
            )
            for t in rep.trips:
                false = {None: "–", True: "<span class='false'>yes</span>", False: "no"}[
                    t.false_rollback
                ]
                out.append(
                    f"<tr><td>{t.index}</td><td class='l'>{_esc(t.pair_id)}</td>"
                    f"<td class='l'>{_esc(t.rule)}</td>"
                    f"<td class='l'>{t.from_state} → {t.to_state}</td><td>{t.epoch}</td>"
                    f"<td class='l'>{false}</td><td class='l'>{_esc(t.reason)}</td></tr>"
                )
            out.append("</table>")
        else:
            out.append("<p>no rule fired</p>")
        out.append("<h3>when each rule alone would have fired</h3><table class='rules'>")
        out.append("<tr><th class='l'>rule</th><th class='l'>shadow pair #</th></tr>")
        for rule in policy.rules:
            fires = rep.rule_fires.get(rule, [])
            out.append(
                f"<tr><td class='l'>{rule}</td>"
                f"<td class='l'>{', '.join(map(str, fires[:20])) or 'never'}"
                f"{' …' if len(fires) > 20 else ''}</td></tr>"
            )
        out.append("</table><h3>metrics against the noise floor</h3>")
        head = "".join(f"<th>p{int(q * 100)}</th>" for q in QUANTILES)
        out.append(f"<table class='quantiles'><tr><th class='l'>metric</th><th>kind</th>{head}")
        out.append("</tr>")
        for name, by_kind in rep.quantiles.items():
            for kind in ("shadow", "noise"):
                qs = by_kind.get(kind)
                if qs is None:
                    continue
                cells = "".join(f"<td>{_fmt(v)}</td>" for v in qs)
                out.append(f"<tr><td class='l'>{name}</td><td>{kind}</td>{cells}</tr>")
        out.append("</table><div class='hists'>")
        for name in rep.quantiles:
            out.append(
                histogram_svg(
                    name,
                    rep.values.get("shadow", {}).get(name, []),
                    rep.values.get("noise", {}).get(name, []),
                )
            )
        out.append("</div><h3>worst pairs</h3><table class='worst'>")
        out.append(
            "<tr><th class='l'>pair id</th><th>similarity</th><th class='l'>verdict</th>"
            "<th class='l'>label</th><th class='l'>reasons</th></tr>"
        )
        for w in rep.worst:
            sim = w["similarity"]
            why = "; ".join(w["reasons"])  # type: ignore[arg-type]
            found = w.get("first_divergent_token")
            if isinstance(found, dict):
                why += "; " + DivergentToken.model_validate(found).line()
            out.append(
                f"<tr><td class='l'>{_esc(w['pair_id'])}</td>"
                f"<td>{_fmt(sim if isinstance(sim, float) else None)}</td>"
                f"<td class='l'>{_esc(w['verdict'])}</td><td class='l'>{_esc(w['label'])}</td>"
                f"<td class='l'>{_esc(why)}</td></tr>"
            )
        out.append("</table></section>")
    out.append("</body></html>")
    return "\n".join(out)


def write_csv(rows: Sequence[dict[str, object]], path: Path) -> None:
    with path.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(SCORE_COLUMNS))
        writer.writeheader()
        writer.writerows(rows)


def parquet_available() -> bool:
    try:
        # Deferred: pyarrow is the optional report extra.
        import pyarrow  # noqa: F401
    except ImportError:
        return False
    return True


def write_parquet(rows: Sequence[dict[str, object]], path: Path) -> None:
    try:
        # Deferred: pyarrow is the optional report extra.
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError as exc:
        raise ConfigError("Parquet output needs pyarrow: pip install 'quantdrift[report]'") from exc
    columns = {c: [r.get(c) for r in rows] for c in SCORE_COLUMNS}
    pq.write_table(pa.table(columns), path)
