"""routing.decide: the table of who serves, who shadows, where to fall back."""

from __future__ import annotations

import pytest

from quantdrift.gateway.chain.routing import RouteDirective, decide, fallback_chain

ORDER = ["int4", "int8", "bf16"]


def d(preference: str = "cost_optimized", state: RouteDirective | None = None, rid: str = "r"):
    return decide(
        order=ORDER,
        candidate="int4",
        reference="bf16",
        preference=preference,
        directive=state,
        request_id=rid,
    )  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("preference", "state", "serve", "mode", "shadow", "chain"),
    [
        ("cost_optimized", None, "int4", "normal", "bf16", ("int4", "int8", "bf16")),
        ("high_precision", None, "bf16", "high_precision", "int4", ("bf16",)),
        ("cost_optimized", RouteDirective("restore", "int4"), "int4", "normal", "bf16", ORDER),
        (
            "cost_optimized",
            RouteDirective("rollback", "bf16"),
            "bf16",
            "rolled_back",
            None,
            ("bf16",),
        ),
        (
            "high_precision",
            RouteDirective("rollback", "bf16"),
            "bf16",
            "high_precision",
            None,
            ("bf16",),
        ),
        (
            "cost_optimized",
            RouteDirective("restore", "bf16"),
            "bf16",
            "rolled_back",
            None,
            ("bf16",),
        ),
        # Rolled back to an intermediate precision: serve it, the reference shadows it.
        (
            "cost_optimized",
            RouteDirective("rollback", "int8"),
            "int8",
            "normal",
            "bf16",
            ("int8", "bf16"),
        ),
        # Half-open: users on the reference, the candidate in shadow (roles swap).
        (
            "cost_optimized",
            RouteDirective("canary", "bf16", 0.0),
            "bf16",
            "half_open",
            "int4",
            ("bf16",),
        ),
        (
            "cost_optimized",
            RouteDirective("canary", "bf16", None),
            "bf16",
            "half_open",
            "int4",
            ("bf16",),
        ),
        (
            "cost_optimized",
            RouteDirective("canary", "bf16", 100.0),
            "int4",
            "canary",
            "bf16",
            ORDER,
        ),
    ],
)
def test_table(preference, state, serve, mode, shadow, chain) -> None:
    decision = d(preference, state)
    assert decision.serve == serve
    assert decision.mode == mode
    assert decision.shadow_precision == shadow
    assert decision.chain == tuple(chain)
    assert decision.pair_reference == "bf16"
    if shadow is not None:
        assert decision.pair_candidate == (serve if serve != "bf16" else "int4")


def test_canary_percent_is_deterministic_per_request() -> None:
    state = RouteDirective("canary", "bf16", 30.0)
    serves = [d(state=state, rid=f"req-{i}").serve for i in range(2000)]
    share = serves.count("int4") / len(serves)
    assert 0.25 < share < 0.35
    assert serves == [d(state=state, rid=f"req-{i}").serve for i in range(2000)]


def test_fallback_chain() -> None:
    assert fallback_chain(ORDER, "int4") == ("int4", "int8", "bf16")
    assert fallback_chain(ORDER, "bf16") == ("bf16",)
    assert fallback_chain(ORDER, "fp8") == ("fp8",)


def capped(
    cap: float | None,
    state: RouteDirective | None = None,
    rid: str = "r",
    pref: str = "cost_optimized",
):  # type: ignore[no-untyped-def]
    return decide(
        order=ORDER,
        candidate="int4",
        reference="bf16",
        preference=pref,  # type: ignore[arg-type]
        directive=state,
        request_id=rid,
        candidate_cap=cap,
    )


def test_a_route_awaiting_preflight_holds_the_candidate_at_its_cap() -> None:
    ids = [f"req-{i}" for i in range(4000)]
    # Cap 0: every user on the reference, the candidate still mirrored in shadow.
    held = [capped(0.0, rid=i) for i in ids]
    assert {x.serve for x in held} == {"bf16"} and {x.mode for x in held} == {"awaiting_preflight"}
    assert {x.shadow_precision for x in held} == {"int4"}
    # Cap 10 %: about a tenth on the candidate, the same requests every time.
    on = [i for i in ids if capped(10.0, rid=i).serve == "int4"]
    assert 0.08 < len(on) / len(ids) < 0.12
    assert on == [i for i in ids if capped(10.0, rid=i).serve == "int4"]
    # A canary is lowered to the cap, never raised by it.
    canary = RouteDirective("canary", "int4", 50.0)
    share = sum(capped(5.0, canary, rid=i).serve == "int4" for i in ids) / len(ids)
    assert share < 0.07
    assert sum(capped(80.0, canary, rid=i).serve == "int4" for i in ids) / len(ids) < 0.55
    # No gate, or a verified one: the cap is None and nothing changes.
    assert capped(None).mode == "normal" and capped(None).serve == "int4"


@pytest.mark.parametrize(
    ("state", "pref", "mode"),
    [
        (RouteDirective("rollback", "bf16"), "cost_optimized", "rolled_back"),
        (RouteDirective("canary", "bf16", 0.0), "cost_optimized", "half_open"),
        (None, "high_precision", "high_precision"),
    ],
)
def test_the_gate_leaves_rules_that_never_serve_the_candidate(state, pref, mode) -> None:  # type: ignore[no-untyped-def]
    assert capped(0.0, state, pref=pref).mode == mode
    assert capped(0.0, state, pref=pref) == capped(None, state, pref=pref)


@pytest.mark.parametrize(
    "directive",
    [
        None,
        RouteDirective("rollback", "bf16"),
        RouteDirective("restore", "bf16"),
        RouteDirective("restore", "int4"),
        RouteDirective("canary", "int4", 0.0),
        RouteDirective("canary", "int4", 20.0),
        RouteDirective("canary", "int4", 100.0),
    ],
)
def test_route_shares_are_decide_over_many_requests(directive: RouteDirective | None) -> None:
    """The follower's per-route split is what ``decide`` does request by request."""
    from collections import Counter

    from quantdrift.gateway.chain.routing import route_shares

    n = 4000
    served = Counter(
        decide(order=["int4", "bf16"], candidate="int4", reference="bf16",
               preference="cost_optimized", directive=directive, request_id=f"r{i}").serve
        for i in range(n)
    )  # fmt: skip
    shares = route_shares(candidate="int4", reference="bf16", directive=directive)
    assert set(shares) == set(served)
    for pool, share in shares.items():
        assert abs(100 * served[pool] / n - share) < 2.5
