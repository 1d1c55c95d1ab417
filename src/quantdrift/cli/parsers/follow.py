"""The flags of ``quantdrift follow`` (what it runs: ``quantdrift.cli.follow``)."""

from __future__ import annotations

import argparse
from pathlib import Path

from quantdrift.cli.common import add_log_level


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("follow")
    p.add_argument("gateway", choices=["nginx"], help="the gateway to steer")
    p.add_argument("--config", type=Path, required=True, help="gateway YAML: routes and pools")
    p.add_argument(
        "--upstream-file", type=Path, required=True, help="the file nginx includes (rewritten)"
    )
    p.add_argument(
        "--reload-cmd",
        default="nginx -s reload",
        help="run after each rewrite (default: %(default)s)",
    )
    p.add_argument(
        "--upstream",
        action="append",
        default=[],
        metavar="ROUTE=NAME",
        help="the upstream name of a route (default quantdrift_<route>, / as _)",
    )
    p.add_argument("--once", action="store_true", help="write the file once and exit")
    add_log_level(p, "info")
    p.set_defaults(func="run", service=True)
