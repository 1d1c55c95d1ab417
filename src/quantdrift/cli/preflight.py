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
from pathlib import Path
from typing import Any, Protocol

from quantdrift.cli.common import comma_names, positive_int

EXIT_NO_GO = 1


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("preflight")
    p.add_argument("--config", type=Path, help="PREFLIGHT.yaml (see examples/preflight.yaml)")
    p.add_argument("--candidate", help="candidate endpoint URL (OpenAI-compatible)")
    p.add_argument("--reference", help="reference endpoint URL")
    p.add_argument("--candidate-model", help="model name the candidate server expects")
    p.add_argument("--reference-model", help="model name the reference server expects")
    p.add_argument("--gateway-url", help="the gateway's URL (load)")
    p.add_argument("--gateway-config", type=Path, help="the gateway's YAML (probes, shadow-link)")
    p.add_argument("--route", help="the route being launched, e.g. cs-agent/int4")
    p.add_argument("--checkpoint", type=Path, help="quantized checkpoint (safetensors dir or GGUF)")
    p.add_argument(
        "--niah-lengths", type=_lengths, help="comma-separated haystack lengths (tokens)"
    )
    p.add_argument("--only", type=_only, help="comma-separated check ids to run")
    p.add_argument("--report", type=Path, help="where to write the JSON report")
    p.add_argument("--html", type=Path, help="where to write the HTML page")
    p.add_argument("--json", action="store_true", help="print the report as JSON on stdout")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    p.set_defaults(func=run)
    ps = p.add_subparsers(dest="preflight_command", parser_class=type(p))
    s = ps.add_parser("sign", help="add a signed approval to a go report")
    s.add_argument("report", type=Path)
    s.add_argument("--by", required=True, help="the approver's name")
    s.add_argument("--key", type=Path, help="Ed25519 private key (default: the settings')")
    s.set_defaults(func=sign)
    v = ps.add_parser("verify", help="go and two distinct signers, or exit 1")
    v.add_argument("report", type=Path)
    v.add_argument("--required", type=positive_int, default=2, help="signers needed (default 2)")
    v.add_argument("--distinct-keys", action="store_true", help="signers must use distinct keys")
    v.add_argument("--json", action="store_true", help="print the verification as JSON")
    v.set_defaults(func=verify)
    g = ps.add_parser("page", help="draw the launch page of a report, with its sign-off block")
    g.add_argument("report", type=Path)
    g.add_argument("--html", type=Path, help="where to write it (default: REPORT with .html)")
    g.add_argument(
        "--required", type=positive_int, help="signers needed (default: the report's policy)"
    )
    g.add_argument(
        "--distinct-keys",
        action="store_true",
        default=None,
        help="signers must use distinct keys (default: the report's policy)",
    )
    g.set_defaults(func=page)
    c = ps.add_parser("certificate", help="a signed certificate binding a build to its evidence")
    c.add_argument("report", type=Path, help="a verified (go, signed) preflight report")
    c.add_argument("--out", type=Path, required=True, help="where to write the certificate")
    c.add_argument("--live", type=Path, help="live evidence after launch (a JSON document)")
    c.add_argument("--key", type=Path, help="Ed25519 private key (default: the settings')")
    c.add_argument("--html", type=Path, help="its page (default: CERT with .html)")
    c.set_defaults(func=certificate)
    vc = ps.add_parser("verify-certificate", help="check a certificate offline, or exit 1")
    vc.add_argument("certificate", type=Path)
    _public_keys(vc)
    vc.add_argument("--json", action="store_true", help="print the check as JSON")
    vc.set_defaults(func=verify_certificate)
    cp = ps.add_parser("certificate-page", help="draw a certificate's page, verified now")
    cp.add_argument("certificate", type=Path)
    _public_keys(cp)
    cp.add_argument("--html", type=Path, help="where to write it (default: CERT with .html)")
    cp.set_defaults(func=certificate_page)
    ev = ps.add_parser(
        "certificate-events",
        help="export a verified certificate as OpenTelemetry gen_ai.evaluation.result events",
    )
    ev.add_argument("certificate", type=Path)
    _public_keys(ev)
    ev.add_argument("--json", action="store_true", help="print the events instead of exporting")
    ev.set_defaults(func=certificate_events)
    k = ps.add_parser("keygen", help="write an Ed25519 key pair: KEY (private) and KEY.pub")
    k.add_argument("key", type=Path)
    k.set_defaults(func=keygen)


def _public_keys(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--public-key",
        type=Path,
        action="append",
        default=[],
        help="a trusted Ed25519 public key (PEM); repeat for each signer",
    )


def _only(text: str) -> list[str]:
    from quantdrift.preflight.runner import CHECK_IDS

    return comma_names(text, CHECK_IDS, "check")


def _lengths(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: use whole numbers, e.g. 256,1024") from None
    if not values or any(v < 16 for v in values):
        raise argparse.ArgumentTypeError(f"{text!r}: lengths must be >= 16 tokens")
    return values


def build_config(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    """The YAML (if any) with the flags on top."""
    from quantdrift.preflight import config as pconfig

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
    from quantdrift.cli.common import load_settings, with_stack
    from quantdrift.preflight.page import draw, page_path
    from quantdrift.preflight.report import report_bytes, summary_lines
    from quantdrift.preflight.runner import run as run_checks
    from quantdrift.services.preflight import preflight_context

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
    from quantdrift.cli.common import load_settings
    from quantdrift.preflight.page import draw, page_path
    from quantdrift.preflight.signoff import sign_file

    signing = load_settings().signing
    record = sign_file(args.report, args.by, signing, time.time(), args.key)
    print(f"{args.report.name}: approved by {record['by']} (key {record['key_id']})")
    b = draw(args.report, page_path(args.report), signing)
    print(f"{page_path(args.report).name}: sign-off {b.state}, {b.valid} of {b.required}")
    return 0


def page(args: argparse.Namespace) -> int:
    from quantdrift.cli.common import load_settings
    from quantdrift.preflight.page import draw, page_path

    out = args.html or page_path(args.report)
    b = draw(args.report, out, load_settings().signing, args.required, args.distinct_keys)
    print(f"{out}: sign-off {b.state}, {b.valid} of {b.required}")
    for m in b.missing:
        print(f"  {m}")
    return 0


def verify(args: argparse.Namespace) -> int:
    from quantdrift.cli.common import load_settings
    from quantdrift.errors import ConfigError
    from quantdrift.preflight.signoff import read_approvals, trusted
    from quantdrift.preflight.signoff import verify as verify_report

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
    from quantdrift.cli.common import load_settings
    from quantdrift.preflight.certificate import issue_file
    from quantdrift.preflight.certificate_page import draw_certificate, page_path

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
    from quantdrift.cli.common import load_settings
    from quantdrift.preflight.certificate import check_file
    from quantdrift.schemas.certificate_live import evidence_lines, evidence_of

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
    from quantdrift.cli.common import load_settings
    from quantdrift.preflight.certificate_page import draw_certificate, page_path

    out = args.html or page_path(args.certificate)
    result = draw_certificate(args.certificate, out, load_settings().signing, args.public_key)
    print(f"{out}: {'verified' if result.ok else 'NOT verified'}")
    for p in result.problems:
        print(f"  {p}")
    return 0


def certificate_events(args: argparse.Namespace) -> int:
    from quantdrift.cli.common import load_settings
    from quantdrift.services.certificate_events import certificate_events as events

    rows = events(args.certificate, load_settings().signing, args.public_key, not args.json)
    if args.json:
        for attrs in rows:
            print(json.dumps({"event_name": "gen_ai.evaluation.result", "attributes": attrs}))
    else:
        print(f"{args.certificate.name}: {len(rows)} gen_ai.evaluation.result events exported")
    return 0


def keygen(args: argparse.Namespace) -> int:
    from quantdrift.preflight.certificate import keygen as write_pair

    key_id = write_pair(args.key)
    print(f"{args.key}: Ed25519 private key {key_id}; public key {args.key}.pub")
    return 0
