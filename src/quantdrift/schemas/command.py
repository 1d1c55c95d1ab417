"""RouteCommand: what a gateway must do for a route; signed, epoch-fenced."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from quantdrift.schemas.base import SCHEMA_VERSION, Message

Action = Literal["rollback", "restore", "canary"]


class RouteCommand(Message):
    """Published to ``quantdrift.control.v1`` and mirrored in the route's Redis key.

    ``canary`` with ``percent`` 0 is the half-open probe: users stay on the
    reference while the candidate runs in shadow.
    """

    schema_version: Literal[1] = SCHEMA_VERSION
    command_id: str
    route: str
    action: Action
    percent: float | None = Field(default=None, ge=0, le=100)
    target_precision: str
    epoch: int = Field(ge=1)
    state: str = ""
    reason: str = ""
    evidence: dict[str, Any] = Field(default_factory=dict)
    issued_at: float
    source: Literal["breaker", "manual"] = "breaker"
    locked: bool = False
    key_id: str = ""
    signature: str = ""
