"""``quantdrift shadow report``'s service: a route's candidates, ranked by cost and quality.

Reads the gateway config (the route's candidate, its ``extra_candidates`` and each
pool's ``cost``) and each candidate's verdict from the breaker's store, the same
reading ``quantdrift route status`` and the verdict API give; ranking is
``evaluation/candidates.py``'s (pure).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from quantdrift.config import Settings
from quantdrift.errors import InputError
from quantdrift.evaluation.candidates import Candidate, cheapest_passing, rank
from quantdrift.gateway.gateway_config import candidate_route, load_config
from quantdrift.services.console import route_status


async def side_by_side(settings: Settings, config_file: Path, route: str) -> list[Candidate]:
    """The route's candidates, ranked; a candidate without pairs yet is inconclusive."""
    config = load_config(config_file)
    rc = config.routes.get(route)
    if rc is None:
        known = ", ".join(sorted(config.routes))
        raise InputError(f"unknown route {route!r} in {config_file}; known: {known}")
    rows = {r["route"]: r for r in await route_status(settings)}
    found = []
    for pool in (rc.candidate, *rc.extra_candidates):
        sub = route if pool == rc.candidate else candidate_route(route, pool)
        row = rows.get(sub)
        verdict = "inconclusive" if row is None else row["verdict"]
        reason = "no shadow pairs seen for this route yet" if row is None else row["reason"]
        if row is not None and pool != rc.candidate and row["state"] != "closed":
            # The verdict API's words assume users are on the route; an extra serves none.
            reason = f"the breaker opened this build's route ({row['state']}); it serves no users"
        pairs = 0 if row is None else int(row["pairs_seen"])
        cost = config.pool(pool).cost
        found.append(Candidate(pool, sub, cost, verdict, reason, pairs, pool == rc.candidate))
    return rank(found)


def as_json(route: str, ranked: list[Candidate]) -> dict[str, Any]:
    best = cheapest_passing(ranked)
    return {
        "route": route,
        "cheapest_passing": None if best is None else best.pool,
        "candidates": [
            {
                "pool": c.pool,
                "route": c.route,
                "cost": c.cost,
                "verdict": c.verdict,
                "pairs": c.pairs,
                "serves_users": c.primary,
                "reason": c.reason,
            }
            for c in ranked
        ],
    }


def as_text(route: str, ranked: list[Candidate]) -> str:
    best = cheapest_passing(ranked)
    lines = [
        f"{route}: cheapest passing build: "
        + ("none" if best is None else f"{best.pool} (cost {_cost(best.cost)})")
    ]
    for i, c in enumerate(ranked, 1):
        serves = ", serves users" if c.primary else ""
        lines.append(
            f"  {i}. {c.pool:<10} {c.verdict:<12} cost {_cost(c.cost):<8} "
            f"pairs {c.pairs:<6} {c.route}{serves}: {c.reason}"
        )
    return "\n".join(lines)


def _cost(cost: float | None) -> str:
    return "-" if cost is None else f"{cost:g}"
