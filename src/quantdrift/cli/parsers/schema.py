"""The flags of ``quantdrift schema`` (what it runs: ``quantdrift.cli.schema``)."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("schema")
    s = p.add_subparsers(dest="schema_command", required=True)
    e = s.add_parser("export", help="write one JSON Schema per message to --out DIR")
    e.add_argument("--out", type=Path, default=None, help="directory to write the schemas to")
    # Where a command writes is a flag (docs/cli.md); the positional form still works.
    e.add_argument("directory", type=Path, nargs="?", default=None, help=argparse.SUPPRESS)
    e.set_defaults(func="export")
