"""``quantdrift schema export --out DIR``: JSON Schemas for gateways in other languages."""

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
    e.set_defaults(func=export)


def export(args: argparse.Namespace) -> int:
    from quantdrift.errors import InputError
    from quantdrift.schemas.export import export_schemas

    if args.out is not None and args.directory is not None and args.out != args.directory:
        raise InputError("give the directory once: --out DIR")
    directory = args.out or args.directory
    if directory is None:
        raise InputError("schema export needs --out DIR")
    if directory.exists() and not directory.is_dir():
        raise InputError(f"{directory} exists and is not a directory")
    for path in export_schemas(directory):
        print(path)
    return 0
