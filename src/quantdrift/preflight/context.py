"""What every check receives: the config, settings (built once at the entry point),
a progress sink (stderr in the CLI), a clock, and the two parts preflight runs but
does not own: the breaker's console and the worker's scorer.

Both are handed in by the entry point (``services.preflight.preflight_context``):
the switch drill runs exactly the console on-call runs, and the shadow link times
exactly the worker's scorer, yet preflight imports neither package.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from quantdrift.preflight.config import PreflightConfig
from quantdrift.preflight.report import Item

if TYPE_CHECKING:
    from quantdrift.config import EmbeddingSettings, Settings
    from quantdrift.schemas import Metrics, PairEvent


class Console(Protocol):
    """The breaker's console as ``quantdrift route`` runs it (``services.console``)."""

    async def manual_step(self, settings: Settings, route: str, action: str, who: str) -> Any:
        """Rollback, restore or release by hand; its ``summary()`` is the console line."""
        ...

    async def route_status(
        self, settings: Settings, route: str | None = None
    ) -> list[dict[str, Any]]: ...

    async def launch_readiness(
        self, settings: Settings, route: str, expected: tuple[str, ...]
    ) -> dict[str, Any]: ...


# The worker's scorer for these embedding settings: pairs in, their metrics out.
PairScorer = Callable[["EmbeddingSettings"], Callable[["Sequence[PairEvent]"], "list[Metrics]"]]


@dataclass(slots=True)
class Context:
    config: PreflightConfig
    settings: Settings | None = None
    progress: Callable[[str], None] = lambda _msg: None
    clock: Callable[[], float] = time.monotonic
    console: Console | None = None
    scorer: PairScorer | None = None
    # Measured context length of the endpoints, filled by the first check that asks.
    cache: dict[str, object] = field(default_factory=dict)


Check = Callable[[Context], Awaitable[Item]]
