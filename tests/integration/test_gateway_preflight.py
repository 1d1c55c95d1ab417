"""The launch gate across its seams: a report from ``quantdrift preflight``, approvals from
``quantdrift preflight sign``, the gateway built by ``quantdrift gateway``'s own builder
from a YAML file, and users on the official ``openai`` SDK.

Until the route's report verifies (``go`` and two distinct signers under the
gateway's key ring), users get the reference and the candidate only runs in
shadow; one signature is not enough; the second opens the candidate without a
restart; an edit to the report after it was signed closes it again. At every
step ``quantdrift preflight verify`` (the CLI a launcher runs) must agree with
what the gateway does.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import openai
import pytest
import yaml

from quantdrift.config import Settings
from quantdrift.gateway.http.observability import health
from quantdrift.services.gateway import build_gateway
from quantdrift.stack import free_port
from support.gateway_upstream import ROUTE, Scripted, serving
from support.preflight import cli

pytestmark = [pytest.mark.timeout(180)]

KEYS = {"ops": "ops-approval-key-for-tests-32-bytes+", "ml": "ml-approval-key-for-tests-32-bytes+"}


ADMIN = "preflight-admin-token"
AS_ADMIN = {"authorization": f"Bearer {ADMIN}"}


async def until(check: Callable[[], Any], what: str, timeout: float = 15.0) -> None:
    """Poll an async health condition until it holds (the gate re-reads every 0.2 s)."""
    deadline = time.monotonic() + timeout
    while not await check():
        assert time.monotonic() < deadline, f"timed out waiting for: {what}"
        await asyncio.sleep(0.05)


async def test_candidate_waits_for_a_verified_preflight(
    scripted: Scripted, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env_vars = {
        "QUANTDRIFT_SIGNING__KEYS": json.dumps(KEYS),
        "QUANTDRIFT_SIGNING__ACTIVE_KEY_ID": "ops",
        # No broker: shadow pairs are not this test's seam (and none are sampled).
        "QUANTDRIFT_KAFKA__BOOTSTRAP_SERVERS": f"127.0.0.1:{free_port()}",
    }
    for k, v in env_vars.items():
        monkeypatch.setenv(k, v)
    env = {**os.environ, **env_vars}
    config = tmp_path / "gateway.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "precisions": {
                    tag: [scripted.base("good", tag)] for tag in ("int4", "int8", "bf16")
                },
                "routes": {
                    ROUTE: {
                        "candidate": "int4",
                        "reference": "bf16",
                        # relative: read beside the config file
                        "preflight": {"report": "preflight.json", "canary_percent": 0},
                    }
                },
                "shadow_sample_rate": 0.0,
                "sample_salt": "s",
                "preflight_refresh_s": 0.2,
                # Signers' names are shown to an authenticated admin only.
                "auth": {"admin_token_sha256": hashlib.sha256(ADMIN.encode()).hexdigest()},
            },
            sort_keys=False,  # the precisions' order is the fallback order
        )
    )
    report = tmp_path / "preflight.json"

    # The launcher's side: a real go report from the preflight CLI.
    ran = cli(
        "preflight",
        "--only",
        "probes",
        "--gateway-config",
        str(config),
        "--route",
        ROUTE,
        "--report",
        str(report),
        "--quiet",
        env=env,
        cwd=tmp_path,
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert json.loads(report.read_bytes())["verdict"] == "go"

    # The CLI runs in a thread: a blocking subprocess call on the event loop the gateway
    # serves from would stall it past its overload bound (the gateway then sheds, 503).
    async def verified_by_cli() -> bool:
        verify = ("preflight", "verify", str(report))
        return (await asyncio.to_thread(cli, *verify, env=env, cwd=tmp_path)).returncode == 0

    gw = build_gateway(config, Settings(), control=False)
    async with serving(gw) as client:
        sdk = openai.AsyncOpenAI(
            base_url=f"{str(client.base_url).rstrip('/')}/v1", api_key="unused", max_retries=0
        )

        async def served(n: int = 12) -> set[str]:
            seen = set()
            for i in range(n):
                raw = await sdk.chat.completions.with_raw_response.create(
                    model=ROUTE, messages=[{"role": "user", "content": f"q{i}"}]
                )
                assert raw.http_response.status_code == 200
                assert raw.parse().choices[0].message.content
                seen.add(raw.headers["x-quantdrift-precision"])
            return seen

        async def gate() -> dict[str, Any]:
            health = (await client.get("/health", headers=AS_ADMIN)).json()["routes"][ROUTE]
            return {"mode": health["mode"], **health["preflight"]}

        # Not signed: every user on the reference.
        g = await gate()
        assert g["verified"] is False and g["mode"] == "awaiting_preflight"
        assert any("0 distinct signers" in p for p in g["problems"])
        assert await served() == {"bf16"}
        assert not await verified_by_cli()

        # One approval is not two.
        sign = ("preflight", "sign", str(report), "--by", "alice")
        signed = await asyncio.to_thread(cli, *sign, env=env, cwd=tmp_path)
        assert signed.returncode == 0, signed.stderr

        async def alice_seen() -> bool:
            return (await gate())["signers"] == ["alice"]

        await until(alice_seen, "the gate to read alice's approval")
        assert (await gate())["verified"] is False
        assert await served() == {"bf16"}
        assert not await verified_by_cli()

        # The second, with another key of the ring: the candidate opens, no restart.
        ml = {**env, "QUANTDRIFT_SIGNING__ACTIVE_KEY_ID": "ml"}
        sign = ("preflight", "sign", str(report), "--by", "bob")
        signed = await asyncio.to_thread(cli, *sign, env=ml, cwd=tmp_path)
        assert signed.returncode == 0, signed.stderr

        async def is_open() -> bool:
            return bool((await gate())["verified"])

        await until(is_open, "the gate to open after the second approval")
        assert (await gate())["mode"] == "normal"
        assert await served() == {"int4"}
        assert await verified_by_cli()
        metrics = (await client.get("/metrics", headers=AS_ADMIN)).text
        assert f'quantdrift_gateway_preflight_verified{{route="{ROUTE}"}} 1.0' in metrics
        assert (await client.get("/health")).status_code == 401
        # A gateway without an admin token shows no names (its /health is anonymous).
        assert "signers" not in health(gw, private=False)["routes"][ROUTE]["preflight"]

        # A verified report replaced by `null`: closed at the very next refresh.
        good = report.read_bytes()
        report.write_bytes(b"null")
        gw.preflight.refresh()  # one refresh, the same the gate's loop runs
        assert gw.preflight.cap(ROUTE) == 0
        assert (await gate())["verified"] is False
        assert any("unverifiable" in p for p in (await gate())["problems"])
        assert await served() == {"bf16"}
        report.write_bytes(good)
        await until(is_open, "the gate to reopen on the verified report")

        # The report edited after it was signed: the approvals no longer fit, it closes.
        edited = json.loads(report.read_bytes())
        edited["items"][0]["evidence"] = {"note": "edited after sign-off"}
        report.write_text(json.dumps(edited))

        async def is_closed() -> bool:
            return not (await gate())["verified"]

        await until(is_closed, "the gate to close on an edited report")
        assert any("signed another version" in p for p in (await gate())["problems"])
        assert await served() == {"bf16"}
        assert not await verified_by_cli()
        await sdk.close()


def test_a_gate_without_its_report_holds_and_says_why(tmp_path: Path) -> None:
    """A missing report is a held route with its reason, not a crash at startup."""
    from quantdrift.gateway.control.preflight_gate import PreflightGate
    from quantdrift.gateway.gateway_config import load_config

    config = tmp_path / "gateway.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "precisions": {"int4": ["http://127.0.0.1:1"], "bf16": ["http://127.0.0.1:2"]},
                "routes": {
                    ROUTE: {
                        "candidate": "int4",
                        "reference": "bf16",
                        "preflight": {"report": "missing.json", "canary_percent": 5},
                    }
                },
            },
            sort_keys=False,
        )
    )
    gate = PreflightGate(load_config(config), {"ops": b"k"})
    gate.refresh()
    assert gate.cap(ROUTE) == 5
    status = gate.health()[ROUTE]
    assert status["verified"] is False
    assert str(tmp_path / "missing.json") in status["problems"][0]


def test_routes_without_a_gate_are_never_capped() -> None:
    from quantdrift.gateway.control.preflight_gate import PreflightGate
    from quantdrift.gateway.gateway_config import parse_config

    cfg = parse_config(
        {
            "precisions": {"int4": ["http://127.0.0.1:1"], "bf16": ["http://127.0.0.1:2"]},
            "routes": {ROUTE: {"candidate": "int4", "reference": "bf16"}},
        }
    )
    gate = PreflightGate(cfg, {})
    gate.refresh()
    assert gate.cap(ROUTE) is None and gate.health() == {}
