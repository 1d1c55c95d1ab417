"""``quantdrift worker [--config SETTINGS.yaml]``: run one Faust worker (scale by running more)."""

from __future__ import annotations

import argparse
from pathlib import Path

from quantdrift.cli.common import (
    add_log_level,
    load_settings,
    redis_url,
    signing_settings,
    with_stack,
)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("worker")
    p.add_argument(
        "--config",
        type=Path,
        default=None,
        help="settings YAML (kafka:, redis:, ...; see docs/settings.md); QUANTDRIFT_* win over it",
    )
    add_log_level(p, "warning")
    p.add_argument("--web-port", type=int, default=None, help="status page port (0 = off)")
    p.set_defaults(func=run, service=True)


def run(args: argparse.Namespace) -> int:
    from quantdrift.services.worker import run_worker

    settings = signing_settings(with_stack(load_settings(args.config)))
    if args.web_port is not None:
        if not 0 <= args.web_port <= 65535:
            raise SystemExit(f"quantdrift: error: --web-port {args.web_port} is not a port")
        settings = settings.model_copy(
            update={"worker": settings.worker.model_copy(update={"web_port": args.web_port})}
        )
    run_worker(settings, redis_url(settings), loglevel=args.log_level)
    return 0
