"""The flags of ``quantdrift distill`` (what it runs: ``quantdrift.cli.distill``)."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("distill")
    p.add_argument(
        "--out", type=Path, default=None, help="model folder (default: the packaged one)"
    )
    p.add_argument(
        "--pairs", type=Path, nargs="*", default=None, help="PairEvent JSONL(.gz) to calibrate on"
    )
    p.add_argument(
        "--calibrate-only", action="store_true", help="keep the model, refit calibration"
    )
    p.add_argument("--threshold", type=float, default=0.88, help="similarity threshold (0.88)")
    p.add_argument("--json", action="store_true", help="print the calibration report as JSON")
    p.set_defaults(func="run")
