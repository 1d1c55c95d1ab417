"""What several commands share: settings from the environment, finding Redis."""

from __future__ import annotations

import argparse
import json
import re
import time
from datetime import datetime
from pathlib import Path

from pydantic import ValidationError

from quantdrift.config import Settings
from quantdrift.errors import ConfigError

STACK_STATE = Path(".quantdrift/stack.json")


def load_settings() -> Settings:
    """The one place the environment is read (QUANTDRIFT_* variables)."""
    try:
        return Settings()
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = "__".join(str(p) for p in first["loc"]).upper()
        raise ConfigError(f"setting QUANTDRIFT_{loc}: {first['msg']}") from exc


def with_stack(settings: Settings, state_path: Path = STACK_STATE) -> Settings:
    """Fill broker and Redis from a running ``quantdrift stack up`` when not set."""
    if not state_path.exists():
        return settings
    data = json.loads(state_path.read_text())
    update: dict[str, object] = {}
    if settings.redis.url is None and data.get("redis_url"):
        update["redis"] = settings.redis.model_copy(update={"url": data["redis_url"]})
    if data.get("bootstrap") and settings.kafka.bootstrap_servers == "127.0.0.1:9092":
        update["kafka"] = settings.kafka.model_copy(update={"bootstrap_servers": data["bootstrap"]})
    return settings.model_copy(update=update) if update else settings


def redis_url(settings: Settings) -> str:
    return settings.redis.url or "redis://127.0.0.1:6379/0"


def signing_settings(settings: Settings) -> Settings:
    """Settings for a command that signs or obeys RouteCommands, checked for a safe key."""
    from quantdrift.config import require_safe_signing

    require_safe_signing(settings, redis_url(settings))
    return settings


def positive_int(text: str) -> int:
    """argparse type: a whole number >= 1, with a one-line reason otherwise."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


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
