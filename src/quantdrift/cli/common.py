"""What several commands share: settings (environment, file, stack state), finding Redis,
the log-level flag, the argparse types for numbers and lists of names, and the flags
of a command that reads topics in a consumer group of its own (``alerts forward``,
``archive``): which group, and when to stop."""

from __future__ import annotations

import argparse
import json
import re
import time
from collections.abc import Collection
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from quantdrift.errors import ConfigError

if TYPE_CHECKING:
    from quantdrift.config import Settings

STACK_STATE = Path(".quantdrift/stack.json")


def load_settings(config_file: Path | None = None) -> Settings:
    """The one place the environment is read (QUANTDRIFT_* variables).

    ``config_file`` is a YAML file of the same tree (``kafka:``, ``redis:``, ...);
    the environment wins over it. A ``QUANTDRIFT_`` variable nothing reads gets a
    warning on stderr naming the closest valid one; a bad value is a ConfigError
    listing every problem.
    """
    # Deferred: pydantic-settings costs ~0.1 s, and --help needs no settings.
    import os
    import sys

    from pydantic import ValidationError
    from pydantic_settings import SettingsError

    from quantdrift.config import Settings
    from quantdrift.config_env import DEPRECATED_ENV, unknown_env

    for line in unknown_env(os.environ, Settings):
        sys.stderr.write(f"quantdrift: warning: {line}\n")
    for old, new in DEPRECATED_ENV.items():
        if old in os.environ:
            sys.stderr.write(f"quantdrift: warning: {old} is deprecated; use {new}\n")
    cls = Settings if config_file is None else _with_file(Settings, config_file)
    try:
        return cls()
    except ValidationError as exc:
        where = f"{config_file} or QUANTDRIFT_*" if config_file else "QUANTDRIFT_*"
        problems = [
            f"{'__'.join(str(p) for p in e['loc']).upper()}: {e['msg']}" for e in exc.errors()
        ]
        raise ConfigError(f"bad setting ({where}) " + "; ".join(problems)) from None
    except SettingsError as exc:
        # pydantic-settings could not even parse a variable (e.g. a dict that is not JSON)
        raise ConfigError(_settings_error_line(exc)) from None


def read_settings_file(path: Path) -> dict[str, object]:
    """A settings YAML file as data, refused whole if it has a key the model lacks."""
    from quantdrift.config import Settings
    from quantdrift.config_env import read_yaml, unknown_keys

    data = read_yaml(path)
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of sections (kafka:, redis:, ...)")
    unknown = unknown_keys(data, Settings)
    if unknown:
        raise ConfigError(f"{path}: " + "; ".join(unknown))
    return data


def _with_file(base: type[Settings], path: Path) -> type[Settings]:
    """``base`` reading ``path`` below the environment (env > file > defaults)."""
    from pydantic_settings import InitSettingsSource, PydanticBaseSettingsSource

    data = read_settings_file(path)

    class FileSettings(base):  # type: ignore[valid-type,misc]
        @classmethod
        def settings_customise_sources(
            cls,
            settings_cls: type[Settings],
            init_settings: PydanticBaseSettingsSource,
            env_settings: PydanticBaseSettingsSource,
            dotenv_settings: PydanticBaseSettingsSource,
            file_secret_settings: PydanticBaseSettingsSource,
        ) -> tuple[PydanticBaseSettingsSource, ...]:
            file_source = InitSettingsSource(settings_cls, init_kwargs=data)
            return (init_settings, env_settings, dotenv_settings, file_secret_settings, file_source)

    return FileSettings


def _settings_error_line(exc: Exception) -> str:
    """'error parsing value for field "signing" ...' -> which variables to look at."""
    import re

    text = str(exc)
    m = re.search(r'field "(\w+)"', text)
    section = m.group(1).upper() if m else ""
    return (
        f"cannot parse the QUANTDRIFT_{section}__* environment variables: {text} "
        '(dict and list values must be JSON, e.g. QUANTDRIFT_SIGNING__KEYS=\'{"k1": "secret"}\')'
    )


def with_stack(settings: Settings, state_path: Path = STACK_STATE) -> Settings:
    """Fill broker and Redis from a running ``quantdrift stack up`` when not set."""
    if not state_path.exists():
        return settings
    try:
        data = json.loads(state_path.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(
            f"cannot read the stack state {state_path} ({exc}); delete it if no stack is running"
        ) from None
    update: dict[str, object] = {}
    if settings.redis.url is None and data.get("redis_url"):
        update["redis"] = settings.redis.model_copy(update={"url": data["redis_url"]})
    if data.get("bootstrap") and settings.kafka.bootstrap_servers == "127.0.0.1:9092":
        update["kafka"] = settings.kafka.model_copy(update={"bootstrap_servers": data["bootstrap"]})
    return settings.model_copy(update=update) if update else settings


def redis_url(settings: Settings) -> str:
    """The Redis this command was configured with; never a guess (one rule for every
    caller: :func:`quantdrift.config.configured_redis_url`)."""
    from quantdrift.config import configured_redis_url

    return configured_redis_url(settings)


def signing_settings(settings: Settings) -> Settings:
    """Settings for a command that signs or obeys RouteCommands, checked for a safe key."""
    from quantdrift.config import require_safe_signing

    # No Redis configured means none is contacted (redis_url() refuses later), so
    # only the broker's hosts can make the dev key unsafe here.
    require_safe_signing(settings, settings.redis.url or "redis://127.0.0.1")
    return settings


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
        import sys

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
