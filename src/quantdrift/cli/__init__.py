"""One command line for all of quantdrift: ``quantdrift <command> ...``.

Each command lives in its own module with ``register(subparsers)``; a bad
argument gets one line on stderr saying what is wrong and exit code 2, and
:mod:`quantdrift.cli.exits` maps what a command raises to the other codes.

``COMMANDS`` is the registry: each command's name, the module that registers it and
the one line ``quantdrift --help`` shows. It is lazy: the parser imports only the
module of the command on the line (``quantdrift --help`` imports none), so what one
command imports at its module's top costs no other command. Inside a command's
module, whatever is heavy (torch, transformers, faust, aiokafka, fastapi, even
pydantic-settings) is still imported by the function that runs it, so that
``quantdrift COMMAND --help`` stays instant too (tests/unit/test_cli_startup.py).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from quantdrift import __version__
from quantdrift.cli import exits


@dataclass(frozen=True, slots=True)
class Command:
    module: str  # its ``register(subparsers)`` adds the command and its arguments
    help: str  # the line ``quantdrift --help`` shows


# The registry, in the order ``quantdrift --help`` lists the commands.
COMMANDS: dict[str, Command] = {
    "stack": Command("quantdrift.cli.stack", "start or stop the embedded broker and Redis"),
    "worker": Command("quantdrift.cli.worker", "score pairs and judge routes (a Faust worker)"),
    "schema": Command("quantdrift.cli.schema", "message schemas"),
    "route": Command("quantdrift.cli.route", "show or steer a route's breaker"),
    "demo": Command("quantdrift.cli.demo", "healthy then drifted pairs on the embedded stack"),
    "score": Command("quantdrift.cli.score", "every metric and the verdict for one pair of texts"),
    "eval": Command(
        "quantdrift.cli.evaluate", "false rollbacks and detection delay per policy, offline"
    ),
    "calibrate": Command(
        "quantdrift.cli.calibrate", "seed the per-route noise floor in Redis from noise pairs"
    ),
    "lab": Command(
        "quantdrift.cli.lab", "real model lab: generate, score and serve quantized variants"
    ),
    "distill": Command(
        "quantdrift.cli.distill", "build the static-embedding tier and its calibration"
    ),
    "gateway": Command(
        "quantdrift.cli.gateway", "OpenAI-compatible gateway with shadow dual-run and guards"
    ),
    "collector": Command(
        "quantdrift.cli.collector",
        "take mirrored requests (nginx, Envoy, Gateway API) and publish pairs",
    ),
    "follow": Command(
        "quantdrift.cli.follow", "apply signed route commands to a gateway we do not own"
    ),
    "shadow": Command(
        "quantdrift.cli.shadow", "shadow traffic as a budget: its cost before it starts"
    ),
    "replay": Command(
        "quantdrift.cli.replay", "re-score pairs under a policy, no side effects; report"
    ),
    "archive": Command(
        "quantdrift.cli.archive", "write pairs and scores topics to compressed JSONL files"
    ),
    "alerts": Command("quantdrift.cli.alerts", "tail the alerts, or forward them to webhooks"),
    "preflight": Command(
        "quantdrift.cli.preflight", "launch checklist: checks, go / no-go, sign-off"
    ),
    "verdict-api": Command(
        "quantdrift.cli.verdict_api", "serve route verdicts to Argo Rollouts / Flagger"
    ),
    "config": Command("quantdrift.cli.config", "show, validate or document the settings"),
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
            importlib.import_module(entry.module).register(sub)
        else:
            sub.add_parser(command, help=entry.help)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser(argv).parse_args(argv)
    if not getattr(args, "service", False):
        # A client command reports a broker it cannot reach in one line of its own;
        # aiokafka's log records ("Unable connect to ...") would only repeat it less
        # clearly. Services (worker, gateway) keep their logs.
        logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    return exits.run(args.func, args)


if __name__ == "__main__":
    raise SystemExit(main())
