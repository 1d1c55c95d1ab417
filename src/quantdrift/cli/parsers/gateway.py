"""The flags of ``quantdrift gateway`` (what it runs: ``quantdrift.cli.gateway``)."""

from __future__ import annotations

import argparse

from quantdrift.cli.common import add_server_args


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("gateway")
    add_server_args(p, 8080)
    p.set_defaults(func="run", service=True)
