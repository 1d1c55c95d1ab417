"""The flags of ``quantdrift calibrate`` (what it runs: ``quantdrift.cli.calibrate``)."""

from __future__ import annotations

import argparse
from pathlib import Path

from quantdrift.cli.common import add_seconds, non_negative_int

EMBEDDERS = ("minilm", "tiered", "static", "none")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("calibrate")
    p.add_argument("pairs", type=Path, nargs="?", help="PairEvent JSONL(.gz) holding noise pairs")
    p.add_argument(
        "--topic",
        nargs="?",
        const="",
        default=None,
        help="read the pairs from a topic range instead (default topic: the pairs topic)",
    )
    p.add_argument("--since", help="topic: start, 1h (ago), ISO time or epoch seconds")
    p.add_argument("--until", help="topic: end (exclusive), same forms as --since")
    p.add_argument("--from-offset", type=non_negative_int, help="topic: first offset per partition")
    p.add_argument("--to-offset", type=non_negative_int, help="topic: stop before this offset")
    p.add_argument("--partition", type=non_negative_int, action="append", help="topic: only these")
    add_seconds(p, "timeout", 60.0, "topic read deadline in seconds")
    p.add_argument(
        "--route",
        action="append",
        default=None,
        help="route to calibrate (repeat); from a topic, from its own pairs only",
    )
    p.add_argument("--redis-url", default=None, help="default: settings or the running stack")
    p.add_argument("--key-prefix", default=None, help="default: settings (qd:)")
    p.add_argument(
        "--embedder", choices=EMBEDDERS, default=None, help="default: the worker's scorer"
    )
    p.add_argument(
        "--blessed-label",
        default=None,
        help="the blessed baseline: shadow pairs whose label, candidate precision, served model "
        "or engine identity (vllm/0.32.0/int8) is one of these, comma-separated",
    )
    p.add_argument("--part", choices=("calibration", "evaluation"), default=None)
    p.add_argument("--merge", action="store_true", help="append to the floor instead of replacing")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.add_argument(
        "--json", action="store_true", help="print one JSON array: an object per floor written"
    )
    p.set_defaults(func="run")
