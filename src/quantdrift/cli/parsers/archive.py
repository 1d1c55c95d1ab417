"""The flags of ``quantdrift archive`` (what it runs: ``quantdrift.cli.archive``)."""

from __future__ import annotations

import argparse
from pathlib import Path

from quantdrift.cli.common import (
    add_consumer_options,
    add_seconds,
)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("archive")
    p.add_argument("--dir", type=Path, required=True, help="archive root directory")
    p.add_argument("--topic", action="append", help="topics (default: the pairs and scores)")
    p.add_argument("--rotate-mb", type=float, default=64.0, help="rotate a file at this size")
    p.add_argument("--rotate-records", type=int, default=100_000, help="or at this many records")
    add_seconds(p, "flush-interval", 60.0, "flush and commit every N seconds")
    add_consumer_options(p, "archive", "records")
    p.set_defaults(func="run")
