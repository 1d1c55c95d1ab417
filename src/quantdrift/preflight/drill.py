"""stub"""

from __future__ import annotations

from quantdrift.preflight.context import Context
from quantdrift.preflight.report import Item, skipped

DRILL = "switch-drill"
TITLE = "drill"


async def switch_drill(ctx: Context) -> Item:
    return skipped(DRILL, "x", "todo")
