"""RouteCommand: what a gateway must do for a route; signed, epoch-fenced.

Targets are named in one vocabulary that every gateway maps onto its own pools:
the route's *role* (``candidate`` / ``reference``). ``target_precision`` is an
optional hint with the concrete precision the breaker's policy names; a gateway
maps the role, and refuses a command whose hint contradicts its own mapping
(never both by accident). The signature is not a field: commands travel inside a
``SignedCommand`` envelope (``schemas/signing.py``) that signs their exact bytes.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from quantdrift.schemas.base import SCHEMA_VERSION, Message

Action = Literal["rollback", "restore", "canary"]
Target = Literal["candidate", "reference"]
TARGETS: tuple[str, ...] = ("candidate", "reference")


class RouteCommand(Message):
    """Published to ``quantdrift.control.v1`` and mirrored in the route's Redis key.

    ``canary`` with ``percent`` 0 is the half-open probe: users stay on the
    reference while the candidate runs in shadow. ``epoch`` is a hybrid logical
    clock (``max(last + 1, issued_at in ms)``), so it keeps growing after Redis
    loses the route's state.
    """

    schema_version: Literal[1] = SCHEMA_VERSION
    command_id: str
    route: str
    action: Action
    percent: float | None = Field(default=None, ge=0, le=100)
    target: Target
    target_precision: str | None = None
    epoch: int = Field(ge=1)
    state: str = ""
    reason: str = ""
    evidence: dict[str, Any] = Field(default_factory=dict)
    issued_at: float
    source: Literal["breaker", "manual"] = "breaker"
    locked: bool = False

    @property
    def users_on_candidate(self) -> bool:
        """True when obeying this command puts (some) users on the candidate."""
        if self.action == "canary":
            return bool(self.percent)
        return self.target == "candidate"
