"""The flags of ``quantdrift route`` (what it runs: ``quantdrift.cli.route``)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    pass


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("route")
    p.add_argument("action", choices=["status", "rollback", "restore", "release"])
    p.add_argument("--route", required=False, help="route name, e.g. cs-agent/int4 (status: all)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func="run")
