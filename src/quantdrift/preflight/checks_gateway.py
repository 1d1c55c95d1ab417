"""stub"""

from __future__ import annotations

from quantdrift.preflight.context import Context
from quantdrift.preflight.report import Item, skipped

PROBES = "probes"
SHADOW = "shadow-link"
TITLES = {PROBES: "probes", SHADOW: "shadow"}


async def probes(ctx: Context) -> Item:
    return skipped(PROBES, "x", "todo")


async def shadow_link(ctx: Context) -> Item:
    return skipped(SHADOW, "x", "todo")
