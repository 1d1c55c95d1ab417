"""``quantdrift follow nginx``: apply signed route commands to an nginx quantdrift does not own.

Reads the routes and pools from a gateway config (the collector's), follows the
control topic and the Redis route keys with the gateway's own verification, and
after each command rewrites ``--upstream-file`` (included by the nginx config: one
``upstream quantdrift_<route>`` block per route) and runs ``--reload-cmd``. Each
switch is logged with its time from the command's issue. ``--once`` writes the file
from the routes' current commands and exits, so nginx can start with it
(docs/collector.md).
"""

from __future__ import annotations

import argparse
import asyncio
import logging

from quantdrift.cli.settings import load_settings, signing_settings, with_stack
from quantdrift.errors import InputError
from quantdrift.services.gateway import follow_nginx


def run(args: argparse.Namespace) -> int:
    names = {}
    for item in args.upstream:
        route, sep, name = item.partition("=")
        if not sep or not route or not name:
            raise InputError(f"--upstream {item!r}: expected ROUTE=NAME")
        names[route] = name
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    settings = signing_settings(with_stack(load_settings()))
    asyncio.run(
        follow_nginx(
            args.config,
            settings,
            args.upstream_file,
            args.reload_cmd,
            names=names,
            once=args.once,
        )
    )
    return 0
