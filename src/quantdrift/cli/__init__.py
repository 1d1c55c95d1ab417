"""One command line for all of quantdrift: ``quantdrift <command> ...``.

Each command lives in its own module with ``register(subparsers)``; a bad
argument gets one line on stderr saying what is wrong and exit code 2.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from quantdrift.errors import QuantdriftError

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
    "quantdrift.cli.replay",
    "quantdrift.cli.archive",
    "quantdrift.cli.alerts",
    "quantdrift.cli.preflight",
    "quantdrift.cli.verdict_api",
)


class _Parser(argparse.ArgumentParser):
    """argparse, but an error is one line, not a usage dump."""

    def error(self, message: str) -> None:  # type: ignore[override]
        sys.stderr.write(f"quantdrift: error: {message}\n")
        raise SystemExit(2)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="quantdrift", description=__doc__.splitlines()[0])
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
    try:
        return int(args.func(args) or 0)
    except QuantdriftError as exc:
        sys.stderr.write(f"quantdrift: {exc}\n")
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
