"""What every check receives: the config, settings (built once at the entry point),
a progress sink (stderr in the CLI) and a clock."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from quantdrift.preflight.config import PreflightConfig
from quantdrift.preflight.report import Item

if TYPE_CHECKING:
    from quantdrift.config import Settings


@dataclass(slots=True)
class Context:
    config: PreflightConfig
    settings: Settings | None = None
    progress: Callable[[str], None] = lambda _msg: None
    clock: Callable[[], float] = time.monotonic
    # Measured context length of the endpoints, filled by the first check that asks.
    cache: dict[str, object] = field(default_factory=dict)


Check = Callable[[Context], Awaitable[Item]]
