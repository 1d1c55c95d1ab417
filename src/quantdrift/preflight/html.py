# ruff: noqa: E501  (HTML templates read best one element a line)
"""The launch page: one self-contained HTML file (inline SVG, no script, no network).

What two people read before they sign, top to bottom: the verdict, and on a
no-go why in one line; the run's inputs as a short table; the sign-off block
(the signers the policy requires, who signed, when, with which key, whether
each approval verifies against the report's exact bytes, what is missing); the
ten items of the launch standard in its order and words (``standard``), each
with its status, the measured value and the threshold in words and units
(``wording``) and its evidence; the checks beyond the standard; the charts
(``plots``). It prints to PDF as it shows (print rules keep rows and charts
whole). The JSON report stays the record: the page is drawn from it, and
redrawn by ``preflight sign`` and ``preflight page`` when approvals change.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from html import escape
from typing import Any

from quantdrift.preflight import standard
from quantdrift.preflight.plots import chart, plots
from quantdrift.preflight.signoff import Block
from quantdrift.preflight.wording import words

__all__ = ["checkpoint_html", "engine_words", "headline", "inputs", "plots", "render", "utc"]

_SHOWN = {"pass": ("passed", "#1a7f37"), "fail": ("failed", "#cf222e"),
          "not run": ("not run", "#9a6700")}  # fmt: skip
_BLOCK = {
    "not-signable": ("Not signable", "#cf222e"),
    "unsigned": ("Unsigned", "#9a6700"),
    "partial": ("Partly signed", "#9a6700"),
    "complete": ("Signed and verified", "#1a7f37"),
    "broken": ("Signatures do not verify", "#cf222e"),
}


def utc(ts: Any) -> str:
    if not isinstance(ts, int | float):
        return "not recorded"
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ts))


def headline(report: Mapping[str, Any]) -> str:
    """The one line at the top: why a no-go is a no-go (a veto first), or that it is go.

    >>> headline({"verdict": "no-go", "vetoes": [{"id": "niah", "reason": "r"}], "items": [
    ...     {"id": "niah", "status": "fail", "evidence": {"why": "r"}},
    ...     {"id": "load", "status": "skipped", "evidence": {"reason": "no peak"}}]})
    'No-go: Long-context needle recall vetoes the launch (r); 1 more item blocks it.'
    >>> headline({"verdict": "no-go", "vetoes": [], "items": [
    ...     {"id": "load", "status": "skipped", "evidence": {"reason": "no peak"}}]})
    'No-go: Load test at 1.5x peak did not run (no peak), and a check that did not run is never a pass.'
    >>> headline({"verdict": "go", "items": [{"id": "probes", "status": "pass"}], "vetoes": []})
    'Go: every check that ran passed (1 of 10 launch items run).'
    """
    rows = standard.rows(report) + standard.beyond(report)
    if report.get("verdict") == "go":
        ran = sum(r.report_item is not None for r in rows if r.item in standard.STANDARD)
        return (
            f"Go: every check that ran passed ({ran} of {len(standard.STANDARD)} launch items run)."
        )
    blocking = [
        r for r in rows
        if r.report_item is not None
        and (r.shown == "fail" or (r.shown == "not run" and r.waiver is None))
    ]  # fmt: skip
    if not blocking:
        return "No-go: nothing was checked."
    first = next((r for r in blocking if r.veto), None) or next(
        (r for r in blocking if r.shown == "fail"), blocking[0]
    )
    why = (
        first.why if len(first.why) <= 140 else first.why[:139] + "…"
    )  # one line; the row has it all
    if first.veto:
        text = f"{first.item.name} vetoes the launch ({why})"
    elif first.shown == "fail":
        text = f"{first.item.name} failed ({why})"
    else:
        text = (
            f"{first.item.name} did not run ({why}), and a check that did not run is never a pass"
        )
    rest = len(blocking) - 1
    more = (
        f"; {rest} more item{'s' if rest > 1 else ''} block{'' if rest > 1 else 's'} it"
        if rest
        else ""
    )
    return f"No-go: {text}{more}."


def engine_words(info: Any) -> str:
    if not isinstance(info, Mapping) or not any(info.values()):
        return "not reported by the server"
    parts = [str(info.get("engine") or "unknown engine")]
    if info.get("version"):
        parts.append(str(info["version"]))
    if info.get("model"):
        parts.append(f"serving {info['model']}")
    return " ".join(parts)


def checkpoint_html(ck: Any) -> str:
    if not isinstance(ck, Mapping):
        return "no checkpoint given (salient_weights.checkpoint): weights not hashed"
    quant = ", ".join(
        f"{k.replace('_', ' ')} {ck[k]}"
        for k in ("format", "quant_method", "bits", "group_size")
        if ck.get(k) is not None
    )
    files = ck.get("files") or {}
    hashes = "<br>".join(
        f"<code>{escape(name)}</code> sha256 <code>{escape(str(sha)[:16])}…</code>"
        for name, sha in list(files.items())[:6]
    )
    more = f"<br>and {len(files) - 6} more files" if len(files) > 6 else ""
    return f"{escape(str(ck.get('name', '?')))} ({escape(quant)})<br>{hashes}{more}"


def inputs(report: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(label, HTML) rows of the inputs table: what was launched, against what, where."""
    s = report.get("subject") or {}
    engines = s.get("engines") or {}

    def url(v: Any) -> str:
        return f"<code>{escape(str(v))}</code>" if v else "not given"

    def served(side: str) -> str:
        if not s.get(side):
            return "not given"
        return f"{url(s.get(side))} &mdash; {escape(engine_words(engines.get(side)))}"

    return [
        ("Route", url(s.get("route"))),
        ("Candidate", served("candidate")),
        ("Reference", served("reference")),
        ("Model and hashes", escape(s["checkpoint_error"]) if s.get("checkpoint_error")
         else checkpoint_html(s.get("checkpoint"))),
        ("Gateway", url(s.get("gateway"))
         + (f" (config <code>{escape(str(s['gateway_config']))}</code>)" if s.get("gateway_config") else "")),
        ("Run", f"{utc(report.get('generated_at'))}; checks run: "
         + escape(", ".join(s.get("checks") or [i["id"] for i in report.get("items", [])]))),
    ]  # fmt: skip


def _signoff(b: Block | None, report: Mapping[str, Any]) -> str:
    if b is None:
        return (
            '<section id="signoff" data-state="unknown"><h2>Sign-off</h2>'
            "<p>Not checked: this page was drawn without the signing key ring. "
            "<code>quantdrift preflight page REPORT</code> draws it with the sign-off.</p></section>"
        )
    label, color = _BLOCK[b.state]
    policy = f"{b.required} distinct signers" + (
        ", each with a key of their own" if b.distinct_keys else ""
    )
    rows = "".join(
        f'<tr class="signature" data-verifies="{str(s.verifies).lower()}">'
        f"<td>{escape(s.by)}</td><td>{utc(s.signed_at)}</td><td><code>{escape(s.key_id)}</code></td>"
        f'<td style="color:{"#1a7f37" if s.verifies else "#cf222e"};font-weight:bold">'
        f"{'verifies' if s.verifies else 'does not verify'}</td>"
        f"<td>{'' if s.verifies else escape(s.problem or '')}</td></tr>"
        for s in b.signatures
    )
    empty = '<tr><td colspan="5"><i>no approval yet</i></td></tr>'
    missing = "".join(f"<li>{escape(m)}</li>" for m in b.missing)
    return f"""<section id="signoff" data-state="{b.state}" data-valid="{b.valid}" data-required="{b.required}">
<h2>Sign-off: <span style="color:{color}">{label}</span> ({b.valid} of {b.required})</h2>
<p>Policy: {escape(policy)}, each approving this report's exact bytes
(sha256 <code>{b.report_sha256}</code>) with a key of the signing key ring or an Ed25519 key.</p>
<table><tr><th>signer</th><th>signed at</th><th>key id</th><th>against these bytes</th><th>why not</th></tr>
{rows or empty}</table>
{"<p>Still missing:</p><ul class='missing'>" + missing + "</ul>" if missing else "<p>Nothing missing.</p>"}
</section>"""


def _evidence(row: standard.Row) -> str:
    it = row.report_item
    bits = []
    if row.why:
        bits.append(escape(row.why))
    if row.waiver:
        bits.append(f"<b>waived</b>: {escape(row.waiver)}")
    if row.veto:
        bits.append("<b>veto</b>: this item alone stops the launch")
    if it is not None:
        dur = (it.get("evidence") or {}).get("duration_s")
        extra = f", {dur:g} s" if isinstance(dur, int | float) else ""
        bits.append(f"<small>check <code>{escape(it['id'])}</code>{extra}</small>")
    return "<br>".join(bits)


def _table(report: Mapping[str, Any], rows: Sequence[standard.Row]) -> str:
    out = []
    for r in rows:
        label, color = _SHOWN[r.shown]
        measured, threshold = words(r.report_item) if r.report_item else ("", "")
        if r.shown == "not run":
            measured = measured or "nothing measured"
        out.append(
            f'<tr class="item" data-check="{escape(r.item.check)}" data-status="{r.shown}">'
            f"<td>{r.item.number}</td><td><b>{escape(r.item.name)}</b><br>"
            f"<small>{escape(r.item.asks)}</small></td>"
            f'<td class="status" style="color:{color}">{label}</td>'
            f"<td>{escape(measured)}</td><td>{escape(threshold)}</td><td>{_evidence(r)}</td></tr>"
        )
        if r.report_item is not None and (svg := chart(report, r.item.check)):
            out.append(f'<tr class="chart"><td></td><td colspan="5">{svg}</td></tr>')
    head = ("<tr><th>#</th><th>launch item</th><th>status</th><th>measured</th>"
            "<th>threshold</th><th>evidence</th></tr>")  # fmt: skip
    return f"<table class='checklist'>{head}{''.join(out)}</table>"


def render(report: Mapping[str, Any], signoff: Block | None = None) -> str:
    """The page of one report; ``signoff`` from :func:`quantdrift.preflight.signoff.block`."""
    verdict = str(report.get("verdict"))
    color = "#1a7f37" if verdict == "go" else "#cf222e"
    s = report.get("subject") or {}
    title = f"Launch record: {s.get('route') or s.get('candidate') or 'preflight'}"
    table = "".join(f"<tr><th>{escape(k)}</th><td>{v}</td></tr>" for k, v in inputs(report))
    beyond = standard.beyond(report)
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{escape(title)}: {escape(verdict)}</title>
<style>body{{font:14px system-ui,sans-serif;margin:2em;max-width:1150px;color:#24292f}}
table{{border-collapse:collapse;margin:4px 0 12px}}td,th{{border-bottom:1px solid #ddd;padding:5px 8px;vertical-align:top;text-align:left}}
.verdict{{font-size:26px;color:{color};font-weight:bold;margin:0}}.headline{{font-size:16px;margin:4px 0 16px}}
td.status{{font-weight:bold;white-space:nowrap}}svg{{margin:4px 0;border:1px solid #eee;max-width:100%;height:auto}}
@page{{margin:14mm}}@media print{{body{{margin:0;max-width:none}}tr,svg,section{{break-inside:avoid}}}}</style>
</head><body>
<h1>{escape(title)}</h1>
<p class="verdict" id="verdict" data-verdict="{escape(verdict)}">{"GO" if verdict == "go" else "NO-GO"}</p>
<p class="headline" id="headline">{escape(headline(report))}</p>
<h2>Inputs</h2>
<table class="inputs">{table}</table>
{_signoff(signoff, report)}
<h2>Launch checklist</h2>
{_table(report, standard.rows(report))}
{"<h2>Beyond the standard</h2>" + _table(report, beyond) if beyond else ""}
<p><small>A check that did not run is never a pass. Full evidence: the JSON report this page is drawn from.</small></p>
</body></html>
"""
