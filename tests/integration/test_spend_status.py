"""Shadow spend and share on the worker's status page, across the seam: two real
``quantdrift gateway`` processes (the example config, teacher forcing on) in front of
scripted upstreams, a real worker with its status page, requests through the openai SDK.

Each gateway reports what its shadowing spent on the reference, and its share, to Redis
(``gateway/control/spend_report.py``); the page (``/status.json`` and the HTML, read in
Debian's chromium when it is installed) shows the route's spend summed over the gateways
alive now. What the reference was asked is counted by the scripted server itself, apart
from the code under test: its chat calls (shadow answers) and its ``/score`` calls (the
teacher-forced passes), with the usage it reported for each.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from quantdrift.config import Settings
from quantdrift.demo.workers import WorkerProcess
from quantdrift.gateway.control.spend_report import SpendReport
from quantdrift.gateway.http.service import Gateway as GatewayService
from quantdrift.stack import EmbeddedStack, free_port
from support.browser import CHROMIUM, chromium_dom
from support.e2e import (
    chat_capital,
    example_config,
    scripted_world,
    shadow_idle,
    start_gateway,
)
from support.gateway_upstream import GOOD, ROOMY, Scripted, chat_body, in_process, make_config
from support.gateway_upstream import ROUTE as ROUTE_MEMORY
from support.scripted_llm import ScriptedLLM, words_of

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

ROUTE = "cs-agent/int4"  # the example config's route
ANSWER = "The capital of France is Paris, a city on the Seine."
SALT = "spend-status-sample-salt-0123456789"
POLICY = {"default": {"min_pairs": 5}}
REPORT_S = 5.0  # a gateway's reporting interval (spend_report.EVERY_S)


@pytest.fixture
def world(
    stack: EmbeddedStack, tmp_path: Path
) -> Iterator[tuple[Settings, WorkerProcess, dict[str, str], ScriptedLLM, str]]:
    def script(llm: ScriptedLLM) -> None:
        llm.texts["int4"] = ANSWER
        llm.texts["bf16"] = ANSWER

    port = free_port()
    with scripted_world(stack, tmp_path, POLICY, script, web_port=port) as world:
        yield (*world, f"http://127.0.0.1:{port}")


def reference_said(llm: ScriptedLLM) -> dict[str, int]:
    """What the scripted reference itself answered and reported in ``usage``: 9 prompt
    tokens and one per word for a chat call; for a forced pass, the prompt's 9 and the
    continuation's words read in, one token out. The gateway's startup probe of teacher
    forcing (one tiny forced pass, a health check, not shadowing) is left out."""
    chats, scores = (
        [b for b in llm.calls_to(tag) if "capital of France" in str(b)]
        for tag in ("bf16", "bf16/score")
    )
    tokens = sum(9 + len(words_of(ANSWER)) for _ in chats) + sum(
        9 + len(words_of(str(b["continuation"]))) + 1 for b in scores
    )
    return {"calls": len(chats) + len(scores), "teacher_forcing_calls": len(scores),
            "tokens": tokens}  # fmt: skip


def spend_row(status: str) -> dict[str, Any] | None:
    data = httpx.get(status + "/status.json", timeout=5).json()
    rows = {r["route"]: r for r in data["routes"]}
    row = rows.get(ROUTE)
    return None if row is None else row["shadow_spend"]


def until_spend(status: str, worker: WorkerProcess, ok: Any, timeout: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while not ((spend := spend_row(status)) is not None and ok(spend)):
        assert worker.alive(), worker.log_tail()
        assert time.monotonic() < deadline, spend
        time.sleep(0.2)
    return spend


def picked(spend: dict[str, Any]) -> dict[str, int]:
    return {k: spend["reference"][k] for k in ("calls", "teacher_forcing_calls", "tokens")}


def test_the_status_page_sums_the_live_gateways_shadow_spend_and_shows_their_share(
    world: Any, tmp_path: Path
) -> None:
    _settings, worker, env, llm, status = world
    config = example_config(llm, SALT, noise_sample_rate=0.0, noise_fill={"max_rate": 0.0})
    config["routes"][ROUTE]["teacher_forced"] = True  # the reference scores the candidate
    first = start_gateway(config, env, tmp_path, "first")
    try:
        chat_capital(first, 5, 0)
        shadow_idle(first)
        said = reference_said(llm)
        assert said["teacher_forcing_calls"] == 5 and said["calls"] == 10  # shadow + forced
        spend = until_spend(status, worker, lambda s: picked(s) == said)
        print(f"\none gateway: {spend}")
        assert spend["gateways"] == 1
        assert (spend["share_min"], spend["share_max"], spend["reasons"]) == (1.0, 1.0, ["flat"])
        assert spend["reference"]["seconds"] > 0
        # Users were served by int4 five times; none of that is shadow spend.
        assert len(llm.calls_to("int4")) == 5
        assert spend["candidate"]["calls"] == 0 and spend["candidate"]["tokens"] == 0
        # The page shows the gateway's own meter: its /health, purpose by purpose.
        mine = first.health()["routes"][ROUTE]["shadow_spend"]["reference"]
        assert spend["reference"]["tokens"] == sum(
            p["prompt_tokens"] + p["completion_tokens"] for p in mine.values()
        )

        second = start_gateway(config, env, tmp_path, "second")
        try:
            chat_capital(second, 3, 100)
            shadow_idle(second)
            said = reference_said(llm)
            spend = until_spend(status, worker, lambda s: s["gateways"] == 2 and picked(s) == said)
            print(f"two gateways: {spend}")
            assert said["teacher_forcing_calls"] == 8
            if CHROMIUM is not None:  # the HTML as a user sees it, drawn by its script
                dom = chromium_dom(status + "/status")
                row = re.search(r'<tr class="route" data-route="cs-agent/int4"[^>]*>', dom)
                assert row is not None, dom[-2000:]
                attrs = dict(re.findall(r'data-([\w-]+)="([^"]*)"', row.group(0)))
                assert attrs["gateways"] == "2" and attrs["forced"] == "8", attrs
                assert int(attrs["reference-tokens"]) == said["tokens"]
                assert "100% (flat)" in dom and "(8 forced) · 2 gw" in dom
        finally:
            second.stop()
        # A gateway that stopped drops out of the sum: what is left is the first's.
        spend = until_spend(status, worker, lambda s: s["gateways"] == 1, timeout=REPORT_S * 4)
        assert spend["reference"]["teacher_forcing_calls"] == 5
    finally:
        first.stop()


async def test_a_redis_that_is_away_fails_no_request_and_the_reports_keep_trying(
    scripted_memory: Scripted,
) -> None:
    """The reports are a background task's: with nothing listening where Redis should be,
    every request is served and shadowed, and each failed write is counted, not fatal."""
    dead = f"redis://127.0.0.1:{free_port()}/0"
    config = make_config(scripted_memory, GOOD, shadow_sample_rate=1.0, timeouts=ROOMY)
    report = SpendReport(config, dead, "qdtest:spend-away:", every_s=0.1, ttl_s=1.0)
    gw = GatewayService(config, spend_report=report, transport=scripted_memory.transport)
    async with in_process(gw) as client:
        for i in range(5):
            resp = await client.post("/v1/chat/completions", json=chat_body(f"away {i}"))
            assert resp.status_code == 200, resp.text
        assert await gw.shadow.wait_idle(20)
        async with asyncio.timeout(20):
            while report.read_errors < 3:  # the start's write, then the task's, failing
                await asyncio.sleep(0.05)
        health = (await client.get("/health")).json()
    assert health["status"] == "ok" and health["failed_tasks"] == [], health
    assert health["spend_report"]["errors"] >= 3
    figures = gw.spend_figures()[ROUTE_MEMORY]
    assert figures["reference"]["calls"] == 5 and figures["share"] == 1.0  # kept, to resend
