"""The flags of ``quantdrift collector`` (what it runs: ``quantdrift.cli.collector``)."""

from __future__ import annotations

import argparse

from quantdrift.cli.common import add_server_args


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("collector")
    add_server_args(p, 8090)
    p.set_defaults(func="run", service=True)
