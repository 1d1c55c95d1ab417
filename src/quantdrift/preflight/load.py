"""stub"""

from __future__ import annotations

from quantdrift.preflight.context import Context
from quantdrift.preflight.report import Item, skipped

LOAD = "load"
TITLE = "load"


async def load(ctx: Context) -> Item:
    return skipped(LOAD, "x", "todo")
