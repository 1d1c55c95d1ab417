"""The gateway's pure fence (applied, command, now -> applied or refusal), and routing a
request by its slice once a slice is held apart.

The commands are the breaker's own: built by ``build_outbox`` from transitions the
pure fold made, signed, and opened as a gateway opens them.
"""

from __future__ import annotations

import pytest

from quantdrift.breaker.policy import RoutePolicy
from quantdrift.gateway.chain.routing import RouteDirective, SliceDirective, decide
from quantdrift.gateway.chain.slices import DIMENSIONS
from quantdrift.gateway.control.fence import AppliedCommand, Refusal, fence
from quantdrift.gateway.control.targets import resolve_target
from quantdrift.gateway.gateway_config import RouteConfig
from quantdrift.integrations.litellm_routing import call_tags, serves_reference
from quantdrift.schemas.command import RouteCommand
from quantdrift.schemas.signing import CommandVerifier
from support.slice_walk import KEY, SliceWalk

ROUTES = {"r": RouteConfig(candidate="int4", reference="bf16")}
POLICY = RoutePolicy(
    rollback_scope="slice", slice_dimensions=("language",), slice_min_pairs=5, min_pairs=5,
    cooldown_s=10.0, half_open_pairs=2,
)  # fmt: skip


def resolve(command: RouteCommand) -> str:
    return resolve_target(command, ROUTES)


async def breaker_commands() -> list[RouteCommand]:
    """A Chinese drift's slice rollback, its half-open and its restore, as signed."""
    walk = SliceWalk(POLICY)
    await walk.until_command("zh")
    await walk.tick(walk.now + 11)
    while len(walk.commands) < 3:
        await walk.pair("zh", False)
    return walk.commands


def fenced(applied: AppliedCommand | None, command: RouteCommand, **kw: object) -> object:
    args: dict[str, object] = {
        "now": 5.0, "wall_now": command.issued_at, "verifier": CommandVerifier({"k1": KEY}),
        "resolve": resolve, "dimensions": DIMENSIONS, "source": "kafka",
    }  # fmt: skip
    return fence(applied, command, **{**args, **kw})  # type: ignore[arg-type]


async def test_a_slice_rollback_holds_the_slice_and_keeps_the_route_on_its_candidate() -> None:
    rollback, probe, restore = await breaker_commands()
    applied = fenced(None, rollback)
    assert isinstance(applied, AppliedCommand)
    assert (applied.target_precision, applied.action, applied.percent) == ("int4", "restore", None)
    (held,) = applied.slices
    assert (held.key, held.action, held.target_precision) == ("language=zh", "rollback", "bf16")
    assert applied.slice_of({"language": "zh"}) == held
    assert applied.slice_of({"language": "en"}) is None

    again = Refusal("duplicate", f"command {rollback.command_id} seen again")
    assert fenced(applied, rollback) == again
    half = fenced(applied, probe)
    assert isinstance(half, AppliedCommand)
    assert [(h.key, h.action, h.percent) for h in half.slices] == [("language=zh", "canary", 0.0)]
    stale = fenced(half, rollback.model_copy(update={"command_id": "x"}))
    assert isinstance(stale, Refusal) and stale.reason == "stale_epoch"
    done = fenced(half, restore)
    assert isinstance(done, AppliedCommand)
    assert (done.slices, done.target_precision) == ((), "int4")


async def test_a_gateway_that_cannot_map_the_slice_refuses_it() -> None:
    rollback, _, _ = await breaker_commands()
    refused = fenced(None, rollback, dimensions=())
    assert isinstance(refused, Refusal) and refused.reason == "unmappable_slice"
    assert "slice language=zh" in refused.message
    odd = rollback.model_copy(update={"route": "elsewhere"})
    assert fenced(None, odd).reason == "unmappable_target"  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("held", "preference", "tags", "serve", "mode", "shadow"),
    [
        ("rollback", "cost_optimized", {"language": "zh"}, "bf16", "slice_rolled_back", None),
        ("rollback", "cost_optimized", {"language": "en"}, "int4", "normal", "bf16"),
        ("rollback", "cost_optimized", {}, "int4", "normal", "bf16"),
        ("rollback", "high_precision", {"language": "zh"}, "bf16", "high_precision", None),
        ("canary", "cost_optimized", {"language": "zh"}, "bf16", "slice_half_open", "int4"),
        ("canary", "cost_optimized", {"language": "ja"}, "int4", "normal", "bf16"),
    ],
)
def test_a_request_is_routed_by_its_slice(
    held: str, preference: str, tags: dict[str, str], serve: str, mode: str, shadow: str | None
) -> None:
    percent = 0.0 if held == "canary" else None
    directive = RouteDirective(
        "restore", "int4", None, (SliceDirective("language", "zh", held, "bf16", percent),)
    )
    d = decide(
        order=["int4", "bf16"], candidate="int4", reference="bf16",
        preference=preference, directive=directive, request_id="q", tags=tags,  # type: ignore[arg-type]
    )  # fmt: skip
    assert (d.serve, d.mode, d.shadow_precision) == (serve, mode, shadow)


async def test_the_litellm_guard_sends_a_held_slices_calls_to_the_reference() -> None:
    # The guard's routing (pure, importable without LiteLLM): the SDK's call bodies
    # tagged by the gateway's one function, the breaker's commands as fenced.
    rollback, probe, restore = await breaker_commands()
    zh = call_tags({"messages": [{"role": "user", "content": "法国的首都是哪里？"}]}, None)
    en = call_tags({"messages": [{"role": "user", "content": "What is the capital?"}]}, None)
    assert (zh["language"], en["language"]) == ("zh", "en")
    held = fenced(None, rollback)
    assert isinstance(held, AppliedCommand)
    assert serves_reference(held, zh, 0.5) and not serves_reference(held, en, 0.5)
    half = fenced(held, probe)
    assert isinstance(half, AppliedCommand) and serves_reference(half, zh, 0.5)
    done = fenced(half, restore)
    assert isinstance(done, AppliedCommand) and not serves_reference(done, zh, 0.5)
    refused = fenced(None, rollback, dimensions=())
    assert isinstance(refused, Refusal)  # a guard that maps no slice keeps serving int4
