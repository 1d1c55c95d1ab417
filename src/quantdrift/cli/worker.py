"""``quantdrift worker [--config SETTINGS.yaml]``: run one Faust worker (scale by running more)."""

from __future__ import annotations

import argparse

from quantdrift.cli.settings import load_settings, redis_url, signing_settings, with_stack
from quantdrift.services.worker import run_worker


def run(args: argparse.Namespace) -> int:
    settings = signing_settings(with_stack(load_settings(args.config)))
    if args.web_port is not None:
        if not 0 <= args.web_port <= 65535:
            raise SystemExit(f"quantdrift: error: --web-port {args.web_port} is not a port")
        settings = settings.model_copy(
            update={"worker": settings.worker.model_copy(update={"web_port": args.web_port})}
        )
    run_worker(settings, redis_url(settings), loglevel=args.log_level)
    return 0
