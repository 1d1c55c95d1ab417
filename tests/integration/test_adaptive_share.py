"""The adaptive shadow share as a user meets it: ``quantdrift gateway`` (its example config
with ``adaptive_share``) -> scripted upstreams, a real worker judging the pairs (the
static scorer tier), the embedded stack. Two gateways in turn on one route:

1. **The cap holds.** ``floor: 0``, ``max: 1``, ``cap_reference_tps: 20``, ``burst_s: 2``:
   the route is warming, so its evidence wants every request shadowed; the bucket
   empties and the share drops to the floor. The reference tokens the reference upstream
   itself reports for the route's shadowing (counted from its own record of calls, apart
   from the gateway) stay within the documented bound: ``cap * (T + burst_s)`` plus the
   jobs in flight (``shadow_concurrency + shadow_queue``, 1 + 1 here).
2. **The share follows the evidence.** ``floor: 0.1``, ``max: 1``: warming, every request
   is shadowed (and ``noise_fill`` makes the floor); once the worker's state says the
   route is armed and its tests are far from their thresholds, the gateway's share
   falls to the floor, in ``/health`` and ``/metrics``, and far fewer requests
   reach the reference.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from quantdrift.config import Settings
from quantdrift.demo.workers import WorkerProcess
from quantdrift.stack import EmbeddedStack
from support.e2e import (
    ANSWERS,
    Gateway,
    chat_capital,
    example_config,
    paraphrasing,
    scripted_world,
    shadow_idle,
    start_gateway,
)
from support.guard import until_seen
from support.scripted_llm import ScriptedLLM

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

ROUTE = "cs-agent/int4"  # the example config's route
FLOOR = 6
SALT = "adaptive-share-sample-salt-0123456"
POLICY = {"default": {"min_pairs": 5, "min_floor_pairs": FLOOR, "slice_min_pairs": 8}}
CAP, BURST = 20.0, 2.0  # reference tokens/s; a scripted reference answer is 9 + ~10 tokens
CAPPED_REQUESTS, ARMING, QUIET = 40, 7, 60


@pytest.fixture
def world(
    stack: EmbeddedStack, tmp_path: Path
) -> Iterator[tuple[Settings, WorkerProcess, dict[str, str], ScriptedLLM]]:
    with scripted_world(stack, tmp_path, POLICY, paraphrasing) as world:
        yield world


def reference_tokens(llm: ScriptedLLM, since: int) -> tuple[int, int]:
    """(calls, tokens) the reference upstream answered after its ``since``-th call, as it
    reports them in ``usage`` (9 prompt tokens and one per word)."""
    calls = llm.calls_to("bf16")[since:]
    return len(calls), sum(9 + len(ANSWERS[0].split(" ")) for _ in calls)


def share_view(gw: Gateway) -> dict[str, Any]:
    view: dict[str, Any] = gw.health()["routes"][ROUTE]["shadow_share"]
    return view


def until_share(gw: Gateway, ok: Any, timeout: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while not ok(view := share_view(gw)):
        assert time.monotonic() < deadline, view
        time.sleep(0.2)
    return view


def gauge(gw: Gateway) -> dict[str, float]:
    text = httpx.get(gw.url + "/metrics", timeout=5).text
    return {
        s.labels["reason"]: s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name == "quantdrift_gateway_shadow_share" and s.labels["route"] == ROUTE
    }


def test_the_share_follows_the_evidence_and_never_spends_past_its_cap(
    world: Any, tmp_path: Path
) -> None:
    settings, worker, env, llm = world
    # 1. The cap: a warming route wants everything; the bucket decides.
    capped = example_config(
        llm, SALT, noise_sample_rate=0.0, noise_fill={"max_rate": 0.0},
        shadow_concurrency=1, shadow_queue=1,
        adaptive_share={"floor": 0.0, "max": 1.0, "cap_reference_tps": CAP, "burst_s": BURST,
                        "refresh_s": 0.3},
    )  # fmt: skip
    gw = start_gateway(capped, env, tmp_path, "capped")
    try:
        view = share_view(gw)
        assert (view["reason"], view["share"], view["evidence"]["state"]) == (
            "warming",
            1.0,
            "unknown",
        ), view
        before = len(llm.calls_to("bf16"))
        t0 = time.monotonic()
        chat_capital(gw, CAPPED_REQUESTS, 0, temperature=0.7)
        shadow_idle(gw)
        elapsed = time.monotonic() - t0
        calls, tokens = reference_tokens(llm, before)
        job = 9 + len(ANSWERS[0].split(" "))
        bound = CAP * (elapsed + BURST) + 2 * job
        print(
            f"\ncapped: {calls} of {CAPPED_REQUESTS} requests shadowed, {tokens} reference "
            f"tokens in {elapsed:.2f} s; bound {bound:.0f} (cap {CAP}/s, burst {BURST} s)"
        )
        assert 0 < tokens <= bound
        assert calls < CAPPED_REQUESTS  # without the cap, a warming route shadows every one
        view = share_view(gw)
        assert view["cap_reference_tps"] == CAP and view["bucket_tokens"] is not None
    finally:
        gw.stop()

    # 2. The evidence: warming -> armed and quiet, the share falls to about its floor.
    following = example_config(
        llm, SALT, noise_sample_rate=0.0,
        noise_fill={"max_rate": 1.0, "floor_pairs": FLOOR, "refresh_s": 0.3},
        adaptive_share={"floor": 0.1, "max": 1.0, "refresh_s": 0.3},
    )  # fmt: skip
    gw = start_gateway(following, env, tmp_path, "following")
    try:
        view = until_share(gw, lambda v: v["evidence"]["state"] == "closed")
        assert (view["reason"], view["share"], view["evidence"]["armed"]) == (
            "warming",
            1.0,
            False,
        ), view
        assert gauge(gw) == {"warming": 1.0}
        seen = calls  # shadow pairs of phase 1 the worker judges too
        before = len(llm.calls_to("bf16"))
        chat_capital(gw, ARMING, CAPPED_REQUESTS, temperature=0.7)
        shadow_idle(gw)
        # Warming at 1.0: every request shadowed (and run again for its noise pair).
        assert len(llm.calls_to("bf16")) - before >= 2 * ARMING
        asyncio.run(until_seen(settings, ROUTE, seen + ARMING, worker, timeout=60))
        view = until_share(gw, lambda v: v["evidence"]["armed"])
        print(f"\narmed: {view}")
        # Armed, every slice judged on enough pairs, its tests far from their thresholds
        # (progress under ``calm``): the share is the floor.
        evidence = view["evidence"]
        assert view["reason"] == "quiet" and view["share"] == 0.1, view
        assert evidence["progress"] < 0.5 and evidence["short_slices"] == 0, view
        assert set(gauge(gw)) == {"quiet"}
        before = len(llm.calls_to("bf16"))
        chat_capital(gw, QUIET, CAPPED_REQUESTS + ARMING, temperature=0.7)
        shadow_idle(gw)
        assert gw.health()["routes"][ROUTE]["noise_floor"]["filling"] is False
        quiet_calls = len(llm.calls_to("bf16")) - before
        print(f"quiet: {quiet_calls} of {QUIET} requests reached the reference")
        # About 0.1 of 60 expected (6): 36 or more has a chance far below 1e-6.
        assert quiet_calls < QUIET * 0.6
    finally:
        gw.stop()
