"""The flags of ``quantdrift config`` (what it runs: ``quantdrift.cli.config``)."""

from __future__ import annotations

import argparse
from pathlib import Path

KINDS = ("gateway", "policy", "preflight", "settings")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("config")
    cmds = p.add_subparsers(dest="config_command", required=True)
    s = cmds.add_parser("show", help="effective settings, secrets masked, with their source")
    s.add_argument("--config", type=Path, default=None, help="a settings YAML file (as worker)")
    s.add_argument("--json", action="store_true", help="print one JSON array")
    s.set_defaults(func="show")
    v = cmds.add_parser("validate", help="every error of a gateway, policy or preflight YAML")
    v.add_argument("file", type=Path, help="the YAML file")
    v.add_argument("--kind", choices=KINDS, default=None, help="default: from its top-level keys")
    v.set_defaults(func="validate")
    r = cmds.add_parser("reference", help="print the Markdown reference of every setting")
    r.set_defaults(func="reference")
