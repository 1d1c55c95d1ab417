"""Preflight's ``load`` check at 1.5x a stated peak, through ``quantdrift gateway``, on vLLM.

The launch question it answers: does the route hold 1.5x its peak through the
gateway in front of the real engines, without an error burst, a stall, or a
process whose memory runs away? The gateway runs as users run it (``quantdrift
gateway --config``, shadowing 5 % of requests to the reference with vLLM teacher
forcing, pairs to the embedded broker); ``quantdrift preflight --only load``
drives it open loop and watches the RSS of the gateway and of the candidate's
vLLM API server.

The stated peak is 1 request/s of 16 tokens: what this tier's engines serve on two
cores while the rest of the suite runs beside them, with room to spare (the check's
1.5x is 1.5 requests/s).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

from quantdrift.demo.workers import settings_env
from quantdrift.stack import EmbeddedStack, free_port
from support.guard import isolated_settings, make_topics
from support.rollback import Child, child_env

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(900)]

ROUTE = "preflight/int4"
PEAK_RPS = 1.0
DURATION_S = 40.0


def engine_pid(engine: Any) -> int:
    """The vLLM API server: the child of ``quantdrift lab vllm`` (its wrapper)."""
    children = psutil.Process(engine.proc.pid).children()
    assert children, f"{engine.variant}: no engine process under lab vllm:\n{engine.tail()}"
    return children[0].pid


async def test_load_at_one_and_a_half_peak_through_the_gateway_on_vllm(
    vllm_engines: dict[str, Any], stack: EmbeddedStack, redis_prefix: str, tmp_path: Path
) -> None:
    cand, ref = vllm_engines["candidate"], vllm_engines["reference"]
    settings = isolated_settings(stack, redis_prefix)
    await make_topics(settings)
    env = settings_env(settings, stack.redis_url)
    config = tmp_path / "gateway.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "precisions": {"int4": [cand.url], "bf16": [ref.url]},
                "precision_models": {"int4": cand.variant, "bf16": ref.variant},
                "pools": {"bf16": {"teacher_forcing": "vllm"}},
                "routes": {
                    ROUTE: {"candidate": "int4", "reference": "bf16", "teacher_forced": True}
                },
                "default_route": ROUTE,
                "shadow_sample_rate": 0.05,
            },
            sort_keys=False,
        )
    )
    port = free_port()
    argv = ["gateway", "--config", str(config), "--port", str(port)]
    gateway = Child("gateway-load", argv, tmp_path, env).start()
    try:
        base = f"http://127.0.0.1:{port}"
        await gateway.healthy(f"{base}/health", 120)
        assert gateway.proc is not None
        preflight = tmp_path / "preflight.yaml"
        preflight.write_text(
            yaml.safe_dump(
                {
                    "gateway_url": base,
                    "route": ROUTE,
                    "report": str(tmp_path / "report.json"),
                    "load": {
                        "peak_rps": PEAK_RPS,
                        "duration_s": DURATION_S,
                        "max_tokens": 16,
                        "pids": {"gateway": gateway.proc.pid, "upstream": engine_pid(cand)},
                    },
                }
            )
        )
        run = subprocess.run(
            [
                *(sys.executable, "-m", "quantdrift", "preflight", "--config", str(preflight)),
                *("--only", "load", "--json", "--quiet"),
            ],
            capture_output=True,
            text=True,
            timeout=600,
            env=child_env(env),
            cwd=tmp_path,
        )
        assert run.returncode in (0, 1), run.stderr
        report = json.loads(run.stdout)
        item = next(i for i in report["items"] if i["id"] == "load")
        measured = item["measured"]
        print(f"\npreflight load through the gateway on vLLM: {item['status']}, {measured}")
        assert item["status"] == "pass", (item, gateway.tail())
        assert measured["rate_rps"] == pytest.approx(1.5 * PEAK_RPS)
        assert measured["requests"] == int(1.5 * PEAK_RPS * DURATION_S)
        assert measured["error_rate"] == 0.0
        assert set(measured["rss_growth"]) == {"gateway", "upstream"}
        assert report["verdict"] == "go", report
    finally:
        gateway.stop()
