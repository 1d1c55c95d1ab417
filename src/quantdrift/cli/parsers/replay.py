"""The flags of ``quantdrift replay`` (what it runs: ``quantdrift.cli.replay``)."""

from __future__ import annotations

import argparse
from pathlib import Path

from quantdrift.cli.common import add_seconds


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("replay")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--topic", nargs="?", const="", help="a topic (default: the pairs topic)")
    src.add_argument("--archive", type=Path, help="an archive directory (quantdrift archive)")
    src.add_argument("--input", type=Path, action="append", help="JSONL(.gz) of pairs or scores")
    p.add_argument("--archive-topic", help="topic inside the archive (default: the pairs topic)")
    p.add_argument("--since", help="start: 1h (ago), ISO time or epoch seconds")
    p.add_argument("--until", help="end (exclusive), same forms as --since")
    p.add_argument("--from-offset", type=int, help="first offset per partition (topic)")
    p.add_argument("--to-offset", type=int, help="stop before this offset per partition")
    p.add_argument("--partition", type=int, action="append", help="only these partitions")
    p.add_argument("--policy", type=Path, help="policy YAML (default: settings' policy_file)")
    p.add_argument(
        "--embedder",
        choices=["none", "static", "tiered", "minilm"],
        default=None,
        help="semantic scorer; default: the worker's (settings embedding.tier)",
    )
    p.add_argument("--out", type=Path, default=Path("replay-report"), help="output directory")
    p.add_argument("--no-parquet", action="store_true", help="skip scores.parquet")
    p.add_argument("--batch", type=int, default=64, help="pairs per embedder call")
    p.add_argument("--worst", type=int, default=10, help="worst pairs listed per route")
    add_seconds(p, "timeout", 120.0, "topic read deadline in seconds")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(func="run")
