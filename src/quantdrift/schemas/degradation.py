"""DegradationEvent: the gateway's JSON or loop guard fell back to a higher precision."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from quantdrift.schemas.base import SCHEMA_VERSION, Message


class DegradationEvent(Message):
    """Published to ``quantdrift.degradations.v1``: a silent retry the user never saw."""

    schema_version: Literal[1] = SCHEMA_VERSION
    event_id: str
    route: str
    precision: str
    fallback_precision: str | None = None
    reason: str
    ts: float
    request_id: str | None = None
    detail: dict[str, str | int | float | bool | None] = Field(default_factory=dict)
