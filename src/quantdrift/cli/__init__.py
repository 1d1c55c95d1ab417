"""One command line for all of quantdrift: ``quantdrift <command> ...``.

Each command is named in one registry (below); a bad argument gets one line on
stderr saying what is wrong and exit code 2, and :mod:`quantdrift.cli.exits` maps
what a command raises to the other codes.

``COMMANDS`` is the registry: each command's name, its module and the one line
``quantdrift --help`` shows. A command is two modules of one name: its flags,
``quantdrift.cli.parsers.NAME`` (``register(subparsers)``, argparse and nothing heavy),
and what it runs, ``quantdrift.cli.NAME``, which imports what it needs at its top.
The parser imports only the flags of the command on the line (``quantdrift --help``
imports none), so ``quantdrift COMMAND --help`` loads no torch, faust or pydantic;
a command's flags name the function that runs it (``set_defaults(func="run")``), and
only then is its module imported (tests/unit/test_cli_startup.py).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import cast

from quantdrift import __version__
from quantdrift.cli import exits


@dataclass(frozen=True, slots=True)
class Command:
    module: str  # quantdrift.cli.parsers.<module> holds its flags, quantdrift.cli.<module> runs it
    help: str  # the line ``quantdrift --help`` shows

    @property
    def parser(self) -> str:
        """The module whose ``register(subparsers)`` adds the command and its flags."""
        return f"quantdrift.cli.parsers.{self.module}"

    @property
    def runner(self) -> str:
        """The module holding the functions the flags name (``func="run"``)."""
        return f"quantdrift.cli.{self.module}"


# The registry, in the order ``quantdrift --help`` lists the commands.
COMMANDS: dict[str, Command] = {
    "stack": Command("stack", "start or stop the embedded broker and Redis"),
    "worker": Command("worker", "score pairs and judge routes (a Faust worker)"),
    "schema": Command("schema", "message schemas"),
    "route": Command("route", "show or steer a route's breaker"),
    "demo": Command("demo", "healthy then drifted pairs on the embedded stack"),
    "score": Command("score", "every metric and the verdict for one pair of texts"),
    "eval": Command("evaluate", "false rollbacks and detection delay per policy, offline"),
    "calibrate": Command("calibrate", "seed the per-route noise floor in Redis from noise pairs"),
    "lab": Command("lab", "real model lab: generate, score and serve quantized variants"),
    "distill": Command("distill", "build the static-embedding tier and its calibration"),
    "gateway": Command("gateway", "OpenAI-compatible gateway with shadow dual-run and guards"),
    "collector": Command(
        "collector",
        "take mirrored requests (nginx, Envoy, Gateway API) and publish pairs",
    ),
    "follow": Command("follow", "apply signed route commands to a gateway we do not own"),
    "shadow": Command("shadow", "shadow traffic as a budget: its cost before it starts"),
    "replay": Command("replay", "re-score pairs under a policy, no side effects; report"),
    "archive": Command("archive", "write pairs and scores topics to compressed JSONL files"),
    "alerts": Command("alerts", "tail the alerts, or forward them to webhooks"),
    "preflight": Command("preflight", "launch checklist: checks, go / no-go, sign-off"),
    "verdict-api": Command("verdict_api", "serve route verdicts to Argo Rollouts / Flagger"),
    "config": Command("config", "show, validate or document the settings"),
}


class _Parser(argparse.ArgumentParser):
    """argparse, but an error is one line, not a usage dump."""

    def error(self, message: str) -> None:  # type: ignore[override]
        sys.stderr.write(f"quantdrift: error: {message}\n")
        raise SystemExit(2)


def chosen(argv: Sequence[str]) -> str | None:
    """The command named on the line: its first word that is not an option (the main
    parser's own options, ``--help`` and ``--version``, take no value)."""
    return next((a for a in argv if not a.startswith("-")), None)


def build_parser(argv: Sequence[str] = ()) -> argparse.ArgumentParser:
    """The parser for ``argv``: the chosen command registered by its module, every
    other command a name and its help line only."""
    parser = _Parser(
        prog="quantdrift",
        description="A streaming guard for quantized LLM rollouts.",
        epilog="Exit codes: 0 ok or go, 1 negative verdict (no-go), 2 usage or bad input, "
        "3 runtime failure (broker or Redis unreachable). "
        "Run `quantdrift COMMAND --help` for a command's options.",
    )
    parser.add_argument("--version", action="version", version=f"quantdrift {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    name = chosen(argv)
    for command, entry in COMMANDS.items():
        if command == name:
            importlib.import_module(entry.parser).register(sub)
        else:
            sub.add_parser(command, help=entry.help)
    return parser


def resolve(args: argparse.Namespace) -> Callable[[argparse.Namespace], int]:
    """The function that runs the parsed command: the one its flags named, from the
    command's runner module, imported now and not before."""
    runner = importlib.import_module(COMMANDS[args.command].runner)
    return cast("Callable[[argparse.Namespace], int]", getattr(runner, args.func))


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser(argv).parse_args(argv)
    if not getattr(args, "service", False):
        # A client command reports a broker it cannot reach in one line of its own;
        # aiokafka's log records ("Unable connect to ...") would only repeat it less
        # clearly. Services (worker, gateway) keep their logs.
        logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    return exits.run(resolve(args), args)


if __name__ == "__main__":
    raise SystemExit(main())
