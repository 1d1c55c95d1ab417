"""routing.decide: the table of who serves, who shadows, where to fall back."""

from __future__ import annotations

import pytest

from quantdrift.gateway.routing import RouteState, decide, fallback_chain

ORDER = ["int4", "int8", "bf16"]


def d(preference: str = "cost_optimized", state: RouteState | None = None, rid: str = "r"):
    return decide(
        order=ORDER,
        candidate="int4",
        reference="bf16",
        preference=preference,
        state=state,
        request_id=rid,
    )  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("preference", "state", "serve", "mode", "shadow", "chain"),
    [
        ("cost_optimized", None, "int4", "normal", "bf16", ("int4", "int8", "bf16")),
        ("high_precision", None, "bf16", "high_precision", "int4", ("bf16",)),
        ("cost_optimized", RouteState("restore", "int4"), "int4", "normal", "bf16", ORDER),
        ("cost_optimized", RouteState("rollback", "bf16"), "bf16", "rolled_back", None, ("bf16",)),
        (
            "high_precision",
            RouteState("rollback", "bf16"),
            "bf16",
            "high_precision",
            None,
            ("bf16",),
        ),
        ("cost_optimized", RouteState("restore", "bf16"), "bf16", "rolled_back", None, ("bf16",)),
        # Rolled back to an intermediate precision: serve it, the reference shadows it.
        (
            "cost_optimized",
            RouteState("rollback", "int8"),
            "int8",
            "normal",
            "bf16",
            ("int8", "bf16"),
        ),
        # Half-open: users on the reference, the candidate in shadow (roles swap).
        (
            "cost_optimized",
            RouteState("canary", "bf16", 0.0),
            "bf16",
            "half_open",
            "int4",
            ("bf16",),
        ),
        (
            "cost_optimized",
            RouteState("canary", "bf16", None),
            "bf16",
            "half_open",
            "int4",
            ("bf16",),
        ),
        ("cost_optimized", RouteState("canary", "bf16", 100.0), "int4", "canary", "bf16", ORDER),
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
    state = RouteState("canary", "bf16", 30.0)
    serves = [d(state=state, rid=f"req-{i}").serve for i in range(2000)]
    share = serves.count("int4") / len(serves)
    assert 0.25 < share < 0.35
    assert serves == [d(state=state, rid=f"req-{i}").serve for i in range(2000)]


def test_fallback_chain() -> None:
    assert fallback_chain(ORDER, "int4") == ("int4", "int8", "bf16")
    assert fallback_chain(ORDER, "bf16") == ("bf16",)
    assert fallback_chain(ORDER, "fp8") == ("fp8",)
