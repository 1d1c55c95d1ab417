"""The side-by-side report's ranking: passing builds first, cheapest first."""

from __future__ import annotations

import pytest

from quantdrift.evaluation.candidates import Candidate, cheapest_passing, rank


def c(pool: str, verdict: str, cost: float | None) -> Candidate:
    return Candidate(pool, f"r@{pool}", cost, verdict, "", 20, pool == "int4")


@pytest.mark.parametrize(
    ("builds", "order", "best"),
    [
        # the cheapest build fails: the next cheapest passing one is named
        ([c("int3", "fail", 0.5), c("int8", "pass", 2.0), c("int4", "pass", 1.0)],
         ["int4", "int8", "int3"], "int4"),
        # a build still warming ranks between passing and failing builds
        ([c("int3", "inconclusive", 0.5), c("int8", "pass", 2.0), c("fp8", "fail", 1.5)],
         ["int8", "int3", "fp8"], "int8"),
        # none passes: none is named
        ([c("int3", "fail", 0.5), c("int4", "inconclusive", 1.0)], ["int4", "int3"], None),
        # a build without a declared cost ranks after the costed ones of its verdict
        ([c("awq", "pass", None), c("int8", "pass", 2.0)], ["int8", "awq"], "int8"),
        ([], [], None),
    ],
)  # fmt: skip
def test_rank(builds: list[Candidate], order: list[str], best: str | None) -> None:
    assert [x.pool for x in rank(builds)] == order
    found = cheapest_passing(builds)
    assert (found.pool if found else None) == best
