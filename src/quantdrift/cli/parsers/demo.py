"""The flags of ``quantdrift demo`` (what it runs: ``quantdrift.cli.demo``)."""

from __future__ import annotations

import argparse
from pathlib import Path

from quantdrift.cli.common import positive_int


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo")
    p.add_argument("--json", action="store_true", help="print one JSON object at the end")
    p.add_argument(
        "--pairs",
        type=Path,
        default=None,
        help="PairEvent JSONL(.gz/.xz) to replay (default: the shipped traffic-corpus slice)",
    )
    p.add_argument("--synthetic", action="store_true", help="generated pairs, not recorded ones")
    p.add_argument("--healthy-pairs", type=positive_int, default=60)
    p.add_argument("--rate", type=float, default=20.0, help="pairs per second")
    p.set_defaults(func="run")
