"""``quantdrift verdict-api``: the verdict API for Argo Rollouts and Flagger.

The bearer token comes from the environment (``QUANTDRIFT_VERDICT_API__TOKEN``)
or a file (``--token-file``, e.g. a mounted Kubernetes Secret), never from the
command line, where ``ps`` would show it. Without one the command refuses to start.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING

from quantdrift.cli.common import load_settings, positive_int, redis_url, with_stack
from quantdrift.errors import ConfigError

if TYPE_CHECKING:
    from quantdrift.integrations.verdict_api import PreflightRule

TOKEN_ENV = "QUANTDRIFT_VERDICT_API__TOKEN"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("verdict-api")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8090)
    p.add_argument("--token-file", type=Path, help=f"bearer token file (else ${TOKEN_ENV})")
    p.add_argument(
        "--preflight",
        action="append",
        default=[],
        metavar="ROUTE=REPORT",
        help="the preflight report Flagger's pre-rollout hook requires for ROUTE (repeatable)",
    )
    p.add_argument(
        "--certificate",
        action="append",
        default=[],
        metavar="ROUTE=CERT",
        help="the quantization certificate a rollout of ROUTE starts from (repeatable)",
    )
    p.add_argument("--required-signers", type=positive_int, default=2)
    p.add_argument("--distinct-keys", action="store_true", help="signers must use distinct keys")
    p.add_argument("--public-url", default="", help="base URL for links in answers")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    p.set_defaults(func=run)


def _token(args: argparse.Namespace) -> str:
    if args.token_file is not None:
        try:
            return args.token_file.read_text().strip()
        except OSError as exc:
            raise ConfigError(f"--token-file {args.token_file}: {exc.strerror or exc}") from exc
    return os.environ.get(TOKEN_ENV, "").strip()


def _preflight(args: argparse.Namespace) -> dict[str, PreflightRule]:
    from quantdrift.integrations.verdict_api import PreflightRule

    rules: dict[str, PreflightRule] = {}
    for item in args.preflight:
        route, sep, report = item.partition("=")
        if not sep or not route or not report:
            raise ConfigError(f"--preflight {item!r}: expected ROUTE=REPORT")
        rules[route] = PreflightRule(Path(report), args.required_signers, args.distinct_keys)
    return rules


def _certificates(args: argparse.Namespace) -> dict[str, Path]:
    out: dict[str, Path] = {}
    for item in args.certificate:
        route, sep, cert = item.partition("=")
        if not sep or not route or not cert:
            raise ConfigError(f"--certificate {item!r}: expected ROUTE=CERT")
        out[route] = Path(cert)
    return out


def run(args: argparse.Namespace) -> int:
    import uvicorn

    from quantdrift.breaker.policy import load_policy
    from quantdrift.integrations.verdict_api import build_service, create_app

    token = _token(args)
    if not token:
        raise ConfigError(f"no bearer token: set ${TOKEN_ENV} or pass --token-file")
    settings = with_stack(load_settings())
    service = build_service(
        redis_url(settings),
        settings.redis.key_prefix,
        settings.signing,
        load_policy(settings.policy_file),
        _preflight(args),
        _certificates(args),
    )
    app = create_app(service, token, args.public_url)
    print(f"verdict API on http://{args.host}:{args.port}/api/v1/routes/ROUTE/verdict", flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)
    return 0
