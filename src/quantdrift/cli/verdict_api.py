"""``quantdrift verdict-api``: the verdict API for Argo Rollouts and Flagger.

The bearer token comes from the environment (``QUANTDRIFT_VERDICT_API__TOKEN``)
or a file (``--token-file``, e.g. a mounted Kubernetes Secret), never from the
command line, where ``ps`` would show it. Without one the command refuses to start.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import uvicorn

from quantdrift.breaker.policy import load_policy
from quantdrift.cli.parsers.verdict_api import TOKEN_ENV
from quantdrift.cli.settings import load_settings, redis_url, with_stack
from quantdrift.errors import ConfigError
from quantdrift.integrations.verdict_api import PreflightRule, build_service, create_app


def _token(args: argparse.Namespace) -> str:
    if args.token_file is not None:
        try:
            return args.token_file.read_text().strip()
        except OSError as exc:
            raise ConfigError(f"--token-file {args.token_file}: {exc.strerror or exc}") from exc
    return os.environ.get(TOKEN_ENV, "").strip()


def _preflight(args: argparse.Namespace) -> dict[str, PreflightRule]:
    return {
        route: PreflightRule(report, args.required_signers, args.distinct_keys)
        for route, report in _per_route(args.preflight, "--preflight", "REPORT").items()
    }


def _certificates(args: argparse.Namespace) -> dict[str, Path]:
    return _per_route(args.certificate, "--certificate", "CERT")


def _per_route(items: list[str], flag: str, what: str) -> dict[str, Path]:
    """``ROUTE=FILE`` values of a repeated flag, by route; a malformed one is refused."""
    out: dict[str, Path] = {}
    for item in items:
        route, sep, path = item.partition("=")
        if not sep or not route or not path:
            raise ConfigError(f"{flag} {item!r}: expected ROUTE={what}")
        out[route] = Path(path)
    return out


def run(args: argparse.Namespace) -> int:
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
