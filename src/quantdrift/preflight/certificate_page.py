# ruff: noqa: E501  (HTML templates read best one element a line)
"""A certificate's page: one self-contained, printable HTML file, drawn from a check made now.

What an auditor or the next rollout's owner reads, top to bottom: whether the
certificate verifies (the issuer's Ed25519 key, each approval, and every problem
in the words ``preflight verify-certificate`` prints), the build it certifies
(weight hashes, format, quantization, group size), the engine fingerprint it was
measured on, the signed preflight report it carries, and the live evidence per
route and slice (``schemas.certificate.live_rows``) with, per route, the time window
of its pairs, the calibration it was judged against and its worst pairs by hash
(``schemas.certificate_live``). A certificate that does not
verify says so first, and what follows is marked as the document's unverified
claim. The page is drawn from the same ``check`` as the command line, so the two
cannot disagree; ``preflight certificate`` draws it on issue and
``preflight certificate-page`` at any time, with the public keys known then.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from html import escape
from pathlib import Path
from typing import Any

from quantdrift.preflight.certificate import check_file
from quantdrift.preflight.html import checkpoint_html, engine_words, utc
from quantdrift.schemas.certificate import CertificateCheck, live_rows
from quantdrift.schemas.certificate_live import live_routes

_OK, _BAD = "#1a7f37", "#cf222e"


def _claimed(raw: bytes) -> dict[str, Any]:
    """The payload as the document states it, unverified (for a page that says so)."""
    try:
        payload = json.loads(json.loads(raw)["payload"])
    except (ValueError, KeyError, TypeError):
        return {}
    return payload if isinstance(payload, dict) else {}


def _signature(c: CertificateCheck) -> str:
    state = "verified" if c.ok else "refused"
    label = (
        "Verified"
        if c.ok
        else ("Signature verified, contents refused" if c.signature_ok else "Does not verify")
    )
    key = f"<code id='issuer'>{escape(c.key_id)}</code>"
    if not c.key_id:
        issuer = "no issuer named"
    elif c.signature_ok:
        issuer = f"signed by {key} (Ed25519)"
    else:
        issuer = f"claims to be signed by {key}: not verified"
    problems = "".join(f"<li>{escape(p)}</li>" for p in c.problems)
    return f"""<section id="signature" data-state="{state}" data-signature="{str(c.signature_ok).lower()}">
<h2>Signature: <span style="color:{_OK if c.ok else _BAD}">{label}</span></h2>
<p>{issuer}; checked against the trusted public keys when this page was drawn.</p>
{"<ul class='problems'>" + problems + "</ul>" if problems else "<p>Nothing wrong: every step of the verification holds.</p>"}
</section>"""


def _approvals(pf: Mapping[str, Any], signers: Sequence[str], verified: bool) -> str:
    rows = "".join(
        f"<tr class='approval' data-by='{escape(str(a.get('by')))}'><td>{escape(str(a.get('by')))}</td>"
        f"<td>{utc(a.get('signed_at'))}</td><td><code>{escape(str(a.get('key_id')))}</code></td>"
        f"<td>{'verifies' if verified and a.get('by') in signers else 'not verified'}</td></tr>"
        for a in pf.get("approvals") or []
    )
    return (
        "<table class='approvals'><tr><th>signer</th><th>signed at</th><th>key id</th><th>approval</th></tr>"
        f"{rows or '<tr><td colspan=4><i>no approval</i></td></tr>'}</table>"
    )


def _evidence(payload: Mapping[str, Any]) -> str:
    live = payload.get("live")
    if not isinstance(live, Mapping):
        return "<p id='no-live'>No live evidence attached: the certificate holds the preflight only.</p>"
    rows = live_rows(str(live.get("text", "")))
    body = "".join(
        f"<tr class='slice' data-route='{escape(r['route'])}' data-slice='{escape(r['slice'])}'>"
        f"<td><code>{escape(r['route'])}</code></td><td>{escape(r['slice'])}</td>"
        f"<td class='pairs'>{r['pairs']}</td><td class='status'>{escape(r['status'])}</td>"
        f"<td>{'' if r['e_value'] is None else format(r['e_value'], 'g')}</td><td>{escape(r['detail'])}</td></tr>"
        for r in rows
    )
    table = (
        "<table class='live'><tr><th>route</th><th>slice</th><th>pairs judged</th><th>status</th>"
        f"<th>largest e-value</th><th>detail</th></tr>{body}</table>"
        if rows
        else "<p>The attached document has no per-route or per-slice rows this page can read.</p>"
    )
    return f"{table}{_bound(str(live.get('text', '')))}<p><small>Live evidence sha256 <code>{escape(str(live.get('sha256')))}</code>, embedded verbatim.</small></p>"


def _number(x: Any) -> str:
    return f"{x:.3f}" if isinstance(x, int | float) and not isinstance(x, bool) else ""


def _bound(text: str) -> str:
    """Per route: the evidence's time window, its calibration and its worst pairs by hash."""
    parts = []
    for r in live_routes(text):
        route = escape(r["route"])
        w = r["window"] if isinstance(r["window"], Mapping) else None
        span = (
            f"from <time class='first'>{utc(w.get('first_pair_at'))}</time> to "
            f"<time class='last'>{utc(w.get('last_pair_at'))}</time>"
            if w
            else "no pair yet"
        )
        cal = "".join(
            f"<tr class='floor' data-mode='{escape(str(c.get('mode')))}'><td>{escape(str(c.get('mode')))}</td>"
            f"<td class='noise'>{c.get('noise_pairs')}</td><td class='blessed'>{c.get('blessed_pairs')}</td>"
            f"<td>{escape(', '.join(map(str, c.get('metrics') or [])) or 'none: the blessing only')}</td><td><code class='sha'>{escape(str(c.get('sha256')))}</code></td></tr>"
            for c in r["calibration"] or []
            if isinstance(c, Mapping)
        )
        worst = "".join(
            f"<tr class='worst'><td><code class='sha'>{escape(str(p.get('pair_sha256')))}</code></td>"
            f"<td>{_number(p.get('similarity'))}</td>"
            f"<td>{escape(', '.join(map(str, p.get('reasons') or [])) or 'no reason')}</td></tr>"
            for p in r["worst_pairs"] or []
            if isinstance(p, Mapping)
        )
        parts.append(
            f"<section class='bound' data-route='{route}'><h3>{route}</h3>"
            f"<p class='window'>{r['pairs']} pairs judged, {span} (the pairs' own times, UTC).</p>"
            "<table class='calibration'><tr><th>floor (decoding)</th><th>noise pairs</th><th>blessed pairs</th><th>metrics</th><th>sha256</th></tr>"
            f"{cal or '<tr><td colspan=5><i>no floor: judged without calibration</i></td></tr>'}</table>"
            "<table class='worst-pairs'><tr><th>worst pair (sha256 of its id)</th><th>similarity</th><th>reasons</th></tr>"
            f"{worst or '<tr><td colspan=3><i>no pair worse than the others yet</i></td></tr>'}</table></section>"
        )
    return "".join(parts)


def render(raw: bytes, c: CertificateCheck) -> str:
    """The page of one certificate (pure), from its bytes and the check of them."""
    payload = c.payload if c.payload is not None else _claimed(raw)
    pf = payload.get("preflight") or {}
    engines = payload.get("engine") or {}
    route = str(payload.get("route") or "no route")
    claim = (
        ""
        if c.signature_ok
        else "<p class='claim' style='color:#cf222e'><b>Unverified:</b> what follows is what the document claims, not what it proves.</p>"
    )
    engine_rows = "".join(
        f"<tr class='engine' data-side='{escape(side)}'><th>{escape(side.capitalize())}</th><td>{escape(engine_words(info))}</td></tr>"
        for side, info in sorted(engines.items())
    )
    files = (payload.get("model") or {}).get("files") or {}
    hashes = "".join(
        f"<tr class='weight' data-file='{escape(str(name))}'><th><code>{escape(str(name))}</code></th>"
        f"<td>sha256 <code class='sha'>{escape(str(sha))}</code></td></tr>"
        for name, sha in sorted(files.items())
    )
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Quantization certificate: {escape(route)}</title>
<style>body{{font:14px system-ui,sans-serif;margin:2em;max-width:1150px;color:#24292f}}
table{{border-collapse:collapse;margin:4px 0 12px}}td,th{{border-bottom:1px solid #ddd;padding:5px 8px;vertical-align:top;text-align:left}}
@page{{margin:14mm}}@media print{{body{{margin:0;max-width:none}}tr,section{{break-inside:avoid}}}}</style>
</head><body>
<h1>Quantization certificate: {escape(route)}</h1>
<p>Issued {utc(payload.get("issued_at"))}.</p>
{_signature(c)}
{claim}
<h2>Build</h2>
<table class="build"><tr><th>Model and hashes</th><td id="build">{checkpoint_html(payload.get("model"))}</td></tr>
{hashes}{engine_rows or "<tr><th>Engines</th><td>not reported</td></tr>"}</table>
<h2>Preflight</h2>
<p id="preflight" data-verdict="{escape(str(pf.get("verdict")))}">Verdict <b>{escape(str(pf.get("verdict")))}</b>;
report sha256 <code>{escape(str(pf.get("report_sha256")))}</code>; {pf.get("required", "?")} signers required{", each with a key of their own" if pf.get("distinct_keys") else ""}.</p>
{_approvals(pf, c.signers, c.ok)}
<h2>Live evidence per slice</h2>
{_evidence(payload)}
<p><small>Verify it yourself: <code>quantdrift preflight verify-certificate CERT --public-key PUB</code>, or <code>node examples/verify_certificate.js PUB... &lt; CERT</code>.</small></p>
</body></html>
"""


def draw_certificate(
    certificate: Path, out: Path, signing: Any, public_keys: Sequence[Path] = ()
) -> CertificateCheck:
    """Check ``certificate`` now and write its page to ``out``; returns the check."""
    result = check_file(certificate, signing, public_keys)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render(certificate.read_bytes(), result), encoding="utf-8")
    return result
