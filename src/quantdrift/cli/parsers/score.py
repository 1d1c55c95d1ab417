"""The flags of ``quantdrift score`` (what it runs: ``quantdrift.cli.score``)."""

from __future__ import annotations

import argparse

EMBEDDERS = ("minilm", "tiered", "static", "none")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("score")
    p.add_argument("candidate", help="candidate text, @FILE, or - for stdin")
    p.add_argument("reference", help="reference text, @FILE, or - for stdin")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument(
        "--embedder",
        choices=EMBEDDERS,
        default=None,
        help="the scorer to build, exactly as named: minilm, tiered, static or none "
        "(no cosine); default: the worker's (settings embedding.tier)",
    )
    p.set_defaults(func="run")
