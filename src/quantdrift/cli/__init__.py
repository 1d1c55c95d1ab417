"""One command line for all of quantdrift: ``quantdrift <command> ...``.

Each command lives in its own module with ``register(subparsers)``; a bad
argument gets one line on stderr saying what is wrong and exit code 2, and
:mod:`quantdrift.cli.exits` maps what a command raises to the other codes.

Command modules import only the standard library at module level: whatever is
heavy (torch, transformers, faust, aiokafka, fastapi, even pydantic-settings)
is imported inside the command that needs it, so ``--help`` stays instant.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

from quantdrift import __version__
from quantdrift.cli import exits

COMMAND_MODULES = (
    "quantdrift.cli.stack",
    "quantdrift.cli.worker",
    "quantdrift.cli.schema",
    "quantdrift.cli.route",
    "quantdrift.cli.demo",
    "quantdrift.cli.score",
    "quantdrift.cli.evaluate",
    "quantdrift.cli.calibrate",
    "quantdrift.cli.lab",
    "quantdrift.cli.distill",
    "quantdrift.cli.gateway",
    "quantdrift.cli.collector",
    "quantdrift.cli.follow",
    "quantdrift.cli.shadow",
    "quantdrift.cli.replay",
    "quantdrift.cli.archive",
    "quantdrift.cli.alerts",
    "quantdrift.cli.preflight",
    "quantdrift.cli.verdict_api",
    "quantdrift.cli.config",
)


class _Parser(argparse.ArgumentParser):
    """argparse, but an error is one line, not a usage dump."""

    def error(self, message: str) -> None:  # type: ignore[override]
        sys.stderr.write(f"quantdrift: error: {message}\n")
        raise SystemExit(2)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="quantdrift",
        description="A streaming guard for quantized LLM rollouts.",
        epilog="Exit codes: 0 ok or go, 1 negative verdict (no-go), 2 usage or bad input, "
        "3 runtime failure (broker or Redis unreachable). "
        "Run `quantdrift COMMAND --help` for a command's options.",
    )
    parser.add_argument("--version", action="version", version=f"quantdrift {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:  # a command not built yet
                continue
            raise
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if not getattr(args, "service", False):
        # A client command reports a broker it cannot reach in one line of its own;
        # aiokafka's log records ("Unable connect to ...") would only repeat it less
        # clearly. Services (worker, gateway) keep their logs.
        logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    return exits.run(args.func, args)


if __name__ == "__main__":
    raise SystemExit(main())
