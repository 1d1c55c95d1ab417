"""AlertEvent: what on-call reads; one per transition, deduped by key."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from quantdrift.schemas.base import SCHEMA_VERSION, Message

Severity = Literal["P0", "P1", "P2", "P3"]


class AlertEvent(Message):
    """Published to ``quantdrift.alerts.v1``; ``dedupe_key`` turns a storm into one page."""

    schema_version: Literal[1] = SCHEMA_VERSION
    alert_id: str
    severity: Severity
    route: str
    kind: str
    summary: str
    evidence: dict[str, Any] = Field(default_factory=dict)
    ts: float
    dedupe_key: str
    epoch: int | None = None
