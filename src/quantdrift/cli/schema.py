"""``quantdrift schema export DIR``: JSON Schemas for gateways in other languages."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("schema", help="message schemas")
    s = p.add_subparsers(dest="schema_command", required=True)
    e = s.add_parser("export", help="write one JSON Schema per message to DIR")
    e.add_argument("directory", type=Path)
    e.set_defaults(func=export)


def export(args: argparse.Namespace) -> int:
    from quantdrift.schemas.export import export_schemas

    if args.directory.exists() and not args.directory.is_dir():
        raise SystemExit(f"quantdrift: error: {args.directory} exists and is not a directory")
    for path in export_schemas(args.directory):
        print(path)
    return 0
