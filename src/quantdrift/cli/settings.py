"""The settings a command runs with: read once from the environment and an optional
YAML file, filled from a running ``quantdrift stack up``, and checked for what the
command needs (a configured Redis, a safe signing key). Only commands that run import
this module, so pydantic-settings is imported at its top (``--help`` never needs it)."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

from pydantic import ValidationError
from pydantic_settings import (
    InitSettingsSource,
    PydanticBaseSettingsSource,
    SettingsError,
)

from quantdrift.config import Settings, configured_redis_url, require_safe_signing
from quantdrift.config_env import DEPRECATED_ENV, read_yaml, unknown_env, unknown_keys
from quantdrift.errors import ConfigError

STACK_STATE = Path(".quantdrift/stack.json")


def load_settings(config_file: Path | None = None) -> Settings:
    """The one place the environment is read (QUANTDRIFT_* variables).

    ``config_file`` is a YAML file of the same tree (``kafka:``, ``redis:``, ...);
    the environment wins over it. A ``QUANTDRIFT_`` variable nothing reads gets a
    warning on stderr naming the closest valid one; a bad value is a ConfigError
    listing every problem.
    """
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
    data = read_yaml(path)
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of sections (kafka:, redis:, ...)")
    unknown = unknown_keys(data, Settings)
    if unknown:
        raise ConfigError(f"{path}: " + "; ".join(unknown))
    return data


def _with_file(base: type[Settings], path: Path) -> type[Settings]:
    """``base`` reading ``path`` below the environment (env > file > defaults)."""
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
    return configured_redis_url(settings)


def signing_settings(settings: Settings) -> Settings:
    """Settings for a command that signs or obeys RouteCommands, checked for a safe key."""
    # No Redis configured means none is contacted (redis_url() refuses later), so
    # only the broker's hosts can make the dev key unsafe here.
    require_safe_signing(settings, settings.redis.url or "redis://127.0.0.1")
    return settings
