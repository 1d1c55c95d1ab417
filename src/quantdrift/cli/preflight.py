"""``quantdrift preflight``: the launch checklist as one command, with vetoes and sign-off.

* ``quantdrift preflight --config PREFLIGHT.yaml`` runs the checks, writes the
  report (JSON) and its HTML page, prints progress on stderr, exits 1 on no-go;
* ``quantdrift preflight --candidate URL --reference URL --only niah,perplexity --json``
  works without a YAML;
* ``quantdrift preflight sign REPORT --by NAME`` adds a signed approval and redraws the page;
* ``quantdrift preflight verify REPORT`` passes only with ``go`` and two distinct signers;
* ``quantdrift preflight page REPORT`` draws the launch page with its sign-off block;
* ``quantdrift preflight keygen KEY`` writes an Ed25519 key pair (KEY and KEY.pub);
* ``quantdrift preflight certificate REPORT --out CERT --key KEY`` issues a quantization
  certificate of a verified report (and its page, CERT with ``.html``),
  ``preflight verify-certificate CERT --public-key PUB`` checks one offline,
  ``preflight certificate-page CERT`` redraws its page, ``preflight certificate-events CERT``
  exports it as OpenTelemetry ``gen_ai.evaluation.result`` events.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from quantdrift.cli.settings import load_settings, with_stack
from quantdrift.errors import ConfigError
from quantdrift.preflight import config as pconfig
from quantdrift.preflight.certificate import check_file, issue_file
from quantdrift.preflight.certificate import keygen as write_pair
from quantdrift.preflight.certificate_page import draw_certificate
from quantdrift.preflight.page import draw, page_path
from quantdrift.preflight.report import report_bytes, summary_lines
from quantdrift.preflight.runner import run as run_checks
from quantdrift.preflight.signoff import read_approvals, sign_file, trusted
from quantdrift.preflight.signoff import verify as verify_report
from quantdrift.schemas.certificate_live import evidence_lines, evidence_of
from quantdrift.services.certificate_events import certificate_events as events
from quantdrift.services.preflight import preflight_context

EXIT_NO_GO = 1


def build_config(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    """The YAML (if any) with the flags on top."""
    cfg = pconfig.load(args.config) if args.config else pconfig.PreflightConfig()
    update: dict[str, object] = {}
    for side in ("candidate", "reference"):
        url, model = getattr(args, side), getattr(args, f"{side}_model")
        if url or model:
            current = getattr(cfg, side)
            if current is None and not url:
                raise SystemExit(f"quantdrift: error: --{side}-model needs --{side}")
            base = current.model_dump() if current else {}
            update[side] = pconfig.EndpointConfig(
                **{**base, **({"url": url} if url else {}), **({"model": model} if model else {})}
            )
    for flag in ("gateway_url", "gateway_config", "route", "report", "html"):
        if getattr(args, flag) is not None:
            update[flag] = getattr(args, flag)
    if args.checkpoint is not None:
        update["salient_weights"] = cfg.salient_weights.model_copy(
            update={"checkpoint": args.checkpoint}
        )
    if args.niah_lengths:
        update["niah"] = cfg.niah.model_copy(update={"lengths": args.niah_lengths})
    return cfg.model_copy(update=update) if update else cfg


def run(args: argparse.Namespace) -> int:
    cfg = build_config(args)

    def progress(msg: str) -> None:
        if not args.quiet:
            sys.stderr.write(f"preflight: {msg}\n")
            sys.stderr.flush()

    settings = with_stack(load_settings())
    ctx = preflight_context(cfg, settings=settings, progress=progress)
    report = asyncio.run(run_checks(ctx, args.only))
    raw = report_bytes(report)
    cfg.report.parent.mkdir(parents=True, exist_ok=True)
    cfg.report.write_bytes(raw)
    html_path = cfg.html or page_path(cfg.report)
    draw(cfg.report, html_path, settings.signing)
    progress(f"report: {cfg.report}  page: {html_path}")
    if args.json:
        sys.stdout.write(raw.decode())
    else:
        print("\n".join(summary_lines(report)))
    return 0 if report["verdict"] == "go" else EXIT_NO_GO


def sign(args: argparse.Namespace) -> int:
    signing = load_settings().signing
    record = sign_file(args.report, args.by, signing, time.time(), args.key)
    print(f"{args.report.name}: approved by {record['by']} (key {record['key_id']})")
    b = draw(args.report, page_path(args.report), signing)
    print(f"{page_path(args.report).name}: sign-off {b.state}, {b.valid} of {b.required}")
    return 0


def page(args: argparse.Namespace) -> int:
    out = args.html or page_path(args.report)
    b = draw(args.report, out, load_settings().signing, args.required, args.distinct_keys)
    print(f"{out}: sign-off {b.state}, {b.valid} of {b.required}")
    for m in b.missing:
        print(f"  {m}")
    return 0


def verify(args: argparse.Namespace) -> int:
    try:
        raw = args.report.read_bytes()
    except OSError as exc:
        raise ConfigError(f"report {args.report}: {exc.strerror or exc}") from exc
    keys = trusted(load_settings().signing)
    result = verify_report(
        raw, read_approvals(args.report), keys, args.required, args.distinct_keys
    )
    detail = f"verdict {result.verdict}"
    return _print_check(args.json, result, args.report.name, "verdict", result.verdict, detail)


def certificate(args: argparse.Namespace) -> int:
    signing = load_settings().signing
    env = issue_file(args.report, args.out, signing, time.time(), args.live, args.key)
    payload = json.loads(env["payload"])
    model = (payload.get("model") or {}).get("name", "no checkpoint hashed")
    print(
        f"{args.out}: certificate of {args.report.name} for {payload.get('route') or 'no route'}"
        f" ({model}; live evidence {'attached' if payload.get('live') else 'not attached'};"
        f" key {env['key_id']})"
    )
    html = args.html or page_path(args.out)
    result = draw_certificate(args.out, html, signing)
    print(f"{html}: {'verified' if result.ok else 'NOT verified'}")
    return 0


def verify_certificate(args: argparse.Namespace) -> int:
    result = check_file(args.certificate, load_settings().signing, args.public_key)
    detail = f"issuer {result.key_id or 'unknown'}"
    evidence = evidence_of(result.payload)
    return _print_check(
        args.json,
        result,
        args.certificate.name,
        "key_id",
        result.key_id,
        detail,
        extra={"evidence": evidence},
        lines=evidence_lines(evidence),
    )


class _Checked(Protocol):
    """A verification's outcome (a report's sign-off, a certificate)."""

    @property
    def ok(self) -> bool: ...
    @property
    def signers(self) -> Sequence[str]: ...
    @property
    def problems(self) -> Sequence[str]: ...


def _print_check(
    as_json: bool,
    result: _Checked,
    name: str,
    key: str,
    value: Any,
    detail: str,
    extra: Mapping[str, Any] | None = None,
    lines: Sequence[str] = (),
) -> int:
    """A verification's outcome, as JSON (``ok``, ``key``, the signers, the problems and
    ``extra``) or as one line (``name: status; detail; signers``), one indented line per
    problem, then ``lines``; exit 0 when it verified, else 1."""
    signers, problems = list(result.signers), list(result.problems)
    if as_json:
        print(
            json.dumps(
                {"ok": result.ok, key: value, "signers": signers, "problems": problems}
                | dict(extra or {})
            )
        )
    else:
        status = "verified" if result.ok else "NOT verified"
        print(f"{name}: {status}; {detail}; signers: {', '.join(signers) or 'none'}")
        for p in problems:
            print(f"  {p}")
        for line in lines:
            print(f"  {line}")
    return 0 if result.ok else 1


def certificate_page(args: argparse.Namespace) -> int:
    out = args.html or page_path(args.certificate)
    result = draw_certificate(args.certificate, out, load_settings().signing, args.public_key)
    print(f"{out}: {'verified' if result.ok else 'NOT verified'}")
    for p in result.problems:
        print(f"  {p}")
    return 0


def certificate_events(args: argparse.Namespace) -> int:
    rows = events(args.certificate, load_settings().signing, args.public_key, not args.json)
    if args.json:
        for attrs in rows:
            print(json.dumps({"event_name": "gen_ai.evaluation.result", "attributes": attrs}))
    else:
        print(f"{args.certificate.name}: {len(rows)} gen_ai.evaluation.result events exported")
    return 0


def keygen(args: argparse.Namespace) -> int:
    key_id = write_pair(args.key)
    print(f"{args.key}: Ed25519 private key {key_id}; public key {args.key}.pub")
    return 0
