"""What several commands share: settings (environment, file, stack state), finding Redis,
the log-level flag, the argparse types for numbers and lists of names, and the flags
of a command that reads topics in a consumer group of its own (``alerts forward``,
``archive``): which group, and when to stop."""

from __future__ import annotations

import argparse
import re
import sys
import time
from collections.abc import Collection
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from quantdrift.errors import ConfigError

if TYPE_CHECKING:
    from quantdrift.config import Settings


def positive_int(text: str) -> int:
    """argparse type: a whole number >= 1, with a one-line reason otherwise."""
    return _at_least(text, 1)


def non_negative_int(text: str) -> int:
    """argparse type: a whole number >= 0, with a one-line reason otherwise."""
    return _at_least(text, 0)


def _at_least(text: str, low: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < low:
        raise argparse.ArgumentTypeError(f"must be >= {low}, got {value}")
    return value


def comma_names(text: str, allowed: Collection[str], what: str) -> list[str]:
    """A comma-separated list of names, each one of ``allowed`` (for an argparse type).

    Refuses an empty list and names every unknown one, with the choices, in one line:

    >>> comma_names("int8, int4", ("int8", "int4", "int2"), "variant")
    ['int8', 'int4']
    >>> comma_names("int8,int9", ("int8", "int4"), "variant")
    Traceback (most recent call last):
    ...
    argparse.ArgumentTypeError: unknown variant int9; choose from int8, int4
    """
    names = [v.strip() for v in text.split(",") if v.strip()]
    bad = [v for v in names if v not in allowed]
    if bad or not names:
        raise argparse.ArgumentTypeError(
            f"unknown {what} {', '.join(bad) or '(none)'}; choose from {', '.join(allowed)}"
        )
    return names


LOG_LEVELS = ("debug", "info", "warning", "error")


class _DeprecatedAlias(argparse.Action):
    """Store like the new flag (named in ``const``), and say on stderr to use that one."""

    def __call__(self, parser, namespace, values, option_string=None):  # type: ignore[no-untyped-def]
        sys.stderr.write(f"quantdrift: warning: {option_string} is deprecated; use {self.const}\n")
        setattr(namespace, self.dest, values)


def add_log_level(parser: argparse.ArgumentParser, default: str) -> None:
    """``--log-level`` for a long-running service; ``--loglevel`` still works, hidden."""
    parser.add_argument("--log-level", default=default, choices=LOG_LEVELS)
    parser.add_argument(
        "--loglevel",
        dest="log_level",
        choices=LOG_LEVELS,
        action=_DeprecatedAlias,
        const="--log-level",
        help=argparse.SUPPRESS,
    )


def add_seconds(
    parser: argparse.ArgumentParser, name: str, default: float | None, help: str
) -> None:
    """A duration flag named with its unit (``--NAME-s``), as every setting is; the old
    unitless ``--NAME`` still works, hidden, with a warning. ``args.NAME`` either way."""
    dest = name.replace("-", "_")
    parser.add_argument(
        f"--{name}-s", dest=dest, type=float, default=default, metavar="SECONDS", help=help
    )
    parser.add_argument(
        f"--{name}",
        dest=dest,
        type=float,
        action=_DeprecatedAlias,
        const=f"--{name}-s",
        help=argparse.SUPPRESS,
    )


def add_consumer_options(parser: argparse.ArgumentParser, name: str, counted: str) -> None:
    """``--group`` (default ``<app_id>-NAME``), and when to stop: ``--max-COUNTED``
    (after N of them) and ``--idle-exit-s`` (after N seconds with none); without
    either the command runs until stopped. ``consumer_loop_options`` reads them back."""
    parser.add_argument("--group", default=None, help=f"consumer group (default <app_id>-{name})")
    parser.add_argument(f"--max-{counted}", type=int, default=None, help=f"stop after N {counted}")
    add_seconds(parser, "idle-exit", None, f"stop after N seconds with no {counted}")
    parser.set_defaults(consumer=(name, counted))


def consumer_loop_options(args: argparse.Namespace, settings: Settings) -> dict[str, Any]:
    """What ``add_consumer_options`` parsed, as the consumer loop's keywords:
    ``group_id``, ``max_<counted>`` and ``idle_exit_s`` (``run_forward`` and
    ``run_archive`` take these names)."""
    name, counted = args.consumer
    return {
        "group_id": args.group or f"{settings.worker.app_id}-{name}",
        f"max_{counted}": getattr(args, f"max_{counted}"),
        "idle_exit_s": args.idle_exit,
    }


_DURATION = re.compile(r"^(\d+(?:\.\d+)?)\s*([smhdw])$")
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_time(value: str | None, now: float | None = None) -> float | None:
    """``1h`` / ``30m`` (ago), an ISO date-time, or epoch seconds -> epoch seconds.

    >>> parse_time("2h", now=10_000.0)
    2800.0
    >>> parse_time("1700000000")
    1700000000.0
    """
    if value is None:
        return None
    now = time.time() if now is None else now
    m = _DURATION.match(value.strip())
    if m:
        return now - float(m.group(1)) * _UNIT[m.group(2)]
    try:
        return float(value)
    except ValueError:
        pass
    try:
        dt = datetime.fromisoformat(value)
    except ValueError as exc:
        raise ConfigError(f"cannot read time {value!r}: use 1h, 30m, ISO 8601 or epoch") from exc
    return dt.timestamp()


def add_server_args(p: argparse.ArgumentParser, port: int) -> None:
    """The options the gateway and the collector share."""
    p.add_argument("--config", type=Path, required=True, help="gateway YAML (see examples/)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=port)
    p.add_argument(
        "--no-control", action="store_true", help="do not follow RouteCommands (no Redis/Kafka)"
    )
    add_log_level(p, "info")
