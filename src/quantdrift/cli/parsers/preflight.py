"""The flags of ``quantdrift preflight`` (what it runs: ``quantdrift.cli.preflight``)."""

from __future__ import annotations

import argparse
from pathlib import Path

from quantdrift.cli.common import comma_names, positive_int


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
    p.set_defaults(func="run")
    ps = p.add_subparsers(dest="preflight_command", parser_class=type(p))
    s = ps.add_parser("sign", help="add a signed approval to a go report")
    s.add_argument("report", type=Path)
    s.add_argument("--by", required=True, help="the approver's name")
    s.add_argument("--key", type=Path, help="Ed25519 private key (default: the settings')")
    s.set_defaults(func="sign")
    v = ps.add_parser("verify", help="go and two distinct signers, or exit 1")
    v.add_argument("report", type=Path)
    v.add_argument("--required", type=positive_int, default=2, help="signers needed (default 2)")
    v.add_argument("--distinct-keys", action="store_true", help="signers must use distinct keys")
    v.add_argument("--json", action="store_true", help="print the verification as JSON")
    v.set_defaults(func="verify")
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
    g.set_defaults(func="page")
    c = ps.add_parser("certificate", help="a signed certificate binding a build to its evidence")
    c.add_argument("report", type=Path, help="a verified (go, signed) preflight report")
    c.add_argument("--out", type=Path, required=True, help="where to write the certificate")
    c.add_argument("--live", type=Path, help="live evidence after launch (a JSON document)")
    c.add_argument("--key", type=Path, help="Ed25519 private key (default: the settings')")
    c.add_argument("--html", type=Path, help="its page (default: CERT with .html)")
    c.set_defaults(func="certificate")
    vc = ps.add_parser("verify-certificate", help="check a certificate offline, or exit 1")
    vc.add_argument("certificate", type=Path)
    _public_keys(vc)
    vc.add_argument("--json", action="store_true", help="print the check as JSON")
    vc.set_defaults(func="verify_certificate")
    cp = ps.add_parser("certificate-page", help="draw a certificate's page, verified now")
    cp.add_argument("certificate", type=Path)
    _public_keys(cp)
    cp.add_argument("--html", type=Path, help="where to write it (default: CERT with .html)")
    cp.set_defaults(func="certificate_page")
    ev = ps.add_parser(
        "certificate-events",
        help="export a verified certificate as OpenTelemetry gen_ai.evaluation.result events",
    )
    ev.add_argument("certificate", type=Path)
    _public_keys(ev)
    ev.add_argument("--json", action="store_true", help="print the events instead of exporting")
    ev.set_defaults(func="certificate_events")
    k = ps.add_parser("keygen", help="write an Ed25519 key pair: KEY (private) and KEY.pub")
    k.add_argument("key", type=Path)
    k.set_defaults(func="keygen")


def _public_keys(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--public-key",
        type=Path,
        action="append",
        default=[],
        help="a trusted Ed25519 public key (PEM); repeat for each signer",
    )


def _only(text: str) -> list[str]:
    # Deferred: the check ids are the runner's table, which loads every check; only
    # --only reads them, and --help must stay light.
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
