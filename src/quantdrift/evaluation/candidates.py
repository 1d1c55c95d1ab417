"""Several builds judged side by side on one route: which is the cheapest that passes.

Pure. Each candidate pool of a route (its candidate and its ``extra_candidates``) has
its own evidence and verdict in the breaker, under its own route id; the report sets
each verdict beside the pool's declared cost (``pools.P.cost``) and ranks them:
passing builds first, cheapest first; then the ones without a verdict yet
(``inconclusive``: warming, or a test that cannot fire yet); then the failing ones.
A build without a declared cost ranks after the costed ones of its verdict. The
verdict is the verdict API's (``integrations/verdict.route_verdict``): ``pass`` only
when the route is closed and armed and no rule fired.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

_ORDER = {"pass": 0, "inconclusive": 1, "fail": 2}


@dataclass(frozen=True, slots=True)
class Candidate:
    """One build on a route: its pool, route id, declared cost and the breaker's verdict."""

    pool: str
    route: str
    cost: float | None
    verdict: str
    reason: str
    pairs: int
    primary: bool  # the route's own candidate, which serves users


def rank(candidates: Sequence[Candidate]) -> list[Candidate]:
    """Passing first, cheapest first (module docstring).

    >>> a = Candidate("int4", "r", 1.0, "pass", "", 30, True)
    >>> b = Candidate("int8", "r@int8", 2.0, "pass", "", 30, False)
    >>> c = Candidate("int3", "r@int3", 0.5, "fail", "", 20, False)
    >>> [x.pool for x in rank([c, b, a])]
    ['int4', 'int8', 'int3']
    """

    def key(c: Candidate) -> tuple[int, float, str]:
        cost = math.inf if c.cost is None else c.cost
        return (_ORDER.get(c.verdict, 1), cost, c.pool)

    return sorted(candidates, key=key)


def cheapest_passing(candidates: Sequence[Candidate]) -> Candidate | None:
    """The cheapest build that passes, None when none does (or none declares a cost and
    several pass: then the first by name, as :func:`rank` orders them)."""
    ranked = rank(candidates)
    return ranked[0] if ranked and ranked[0].verdict == "pass" else None
