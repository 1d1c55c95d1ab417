"""``quantdrift schema export --out DIR``: JSON Schemas for gateways in other languages."""

from __future__ import annotations

import argparse

from quantdrift.errors import InputError
from quantdrift.schemas.export import export_schemas


def export(args: argparse.Namespace) -> int:
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
