"""RouteCommand: what a gateway must do for a route; signed, epoch-fenced.

Targets are named in one vocabulary that every gateway maps onto its own pools:
the route's *role* (``candidate`` / ``reference``). ``target_precision`` is an
optional hint with the concrete precision the breaker's policy names; a gateway
maps the role, and refuses a command whose hint contradicts its own mapping
(never both by accident). The signature is not a field: commands travel inside a
``SignedCommand`` envelope (``schemas/signing.py``) that signs their exact bytes.

**Slices.** A command with a ``slice`` selector (a tag dimension and its value, as
``PairEvent.tags`` names them) moves only that slice's requests: its ``action`` /
``target`` / ``percent`` are the slice's, and the rest of the route stays on its
candidate. Every command also carries ``slices``: every slice held apart from the
route at its epoch, this one included. A gateway keeps only the latest command of a
route (the Redis key, the control topic's replay), so the latest command alone must
say where every slice goes: a gateway applies the whole list, not a difference. A
command without a selector moves the whole route, and a whole-route rollback holds
no slices (every request goes to the reference anyway). A gateway that cannot map a
selector refuses the command and counts it, never a 5xx (``gateway/control``).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from quantdrift.schemas.base import SCHEMA_VERSION, Message

Action = Literal["rollback", "restore", "canary"]
Target = Literal["candidate", "reference"]
TARGETS: tuple[str, ...] = ("candidate", "reference")
# A slice's dimension is a tag name of ``PairEvent.tags``; its value a tag value.
TAG_NAME = r"^[a-z][a-z0-9_]{0,31}$"


class SliceSelector(BaseModel):
    """One slice of a route's requests: those whose tag ``dimension`` is ``value``."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    dimension: str = Field(pattern=TAG_NAME)
    value: str = Field(min_length=1, max_length=64)

    @property
    def key(self) -> str:
        """``dimension=value``, as state, alerts and status name a slice."""
        return f"{self.dimension}={self.value}"


class SliceHold(SliceSelector):
    """Where one slice's requests go at a command's epoch: rolled back to the reference
    (``rollback``), or half-open (``canary`` at 0 %: the reference serves, the candidate
    runs in shadow for that slice)."""

    action: Action
    target: Target
    percent: float | None = Field(default=None, ge=0, le=100)


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
    slice: SliceSelector | None = None
    slices: tuple[SliceHold, ...] = ()

    @property
    def users_on_candidate(self) -> bool:
        """True when obeying this command puts (some) users on the candidate."""
        if self.action == "canary":
            return bool(self.percent)
        return self.target == "candidate"
