"""The flags of ``quantdrift stack`` (what it runs: ``quantdrift.cli.stack``)."""

from __future__ import annotations

import argparse
from pathlib import Path

_REDIS_SCHEMES = ("redis://", "rediss://", "unix://")


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add ``stack up`` and ``stack down`` to the main parser's subcommands."""
    stack = subparsers.add_parser("stack")
    commands = stack.add_subparsers(dest="stack_command", metavar="{up,down}", required=True)

    up = commands.add_parser(
        "up",
        help="start Tansu and a Redis in the background; prints export lines to eval",
    )
    up.add_argument(
        "--redis-url",
        type=_redis_url,
        default=None,
        help="use this Redis instead of starting one",
    )
    up.add_argument(
        "--adopt-redis",
        action="store_true",
        help="use a Redis already answering on 127.0.0.1:6379 instead of starting one "
        "(off by default: a Redis we did not start may hold someone else's keys)",
    )
    up.add_argument("--state", type=Path, default=None, help="state file (.quantdrift/stack.json)")
    up.set_defaults(func="stack_up")

    down = commands.add_parser("down", help="stop what `stack up` started")
    down.add_argument(
        "--state", type=Path, default=None, help="state file (.quantdrift/stack.json)"
    )
    down.set_defaults(func="stack_down")


def _redis_url(value: str) -> str:
    if not value.startswith(_REDIS_SCHEMES):
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a Redis URL (expected redis://, rediss:// or unix://)"
        )
    return value
