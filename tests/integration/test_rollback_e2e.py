"""The guard loop as a user meets it: OpenAI SDK -> ``quantdrift gateway`` -> real models.

Two ``quantdrift lab serve`` upstreams (SmolLM2-135M: the candidate ``int4-g64``
and the reference ``ref-f32``) behind ``quantdrift gateway`` with a config shaped
like ``examples/gateway.yaml`` (pools ``int4`` and ``bf16``), every request
shadowed; a real worker judges the pairs. Walk the route through everything a
rollback promises:

1. drive SDK traffic until the breaker rolls back: later requests are served
   by ``bf16``, with 200s (the time from the decisive pair's publication to the
   gateway serving the reference is printed);
2. the cool-down passes: half-open, users still on ``bf16``, the candidate in
   shadow; the candidate upstream restarts as ``int8`` on the same port, passes
   its probes, and the breaker restores: requests go back to ``int4``;
3. the console: ``quantdrift route rollback | restore | release`` each give
   200s on the expected side.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml

from quantdrift.demo.workers import settings_env
from quantdrift.schemas import PairEvent
from quantdrift.schemas.signing import verifier_from_settings
from quantdrift.stack import EmbeddedStack, free_port
from support.guard import isolated_settings, make_topics, records_for
from support.rollback import (
    Child,
    ControlWatch,
    Reply,
    Seen,
    ask,
    child_env,
    lab,
    until_gateway,
)
from support.workers import start_worker

openai = pytest.importorskip("openai")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

ROUTE = "cs-agent/int4"
MAX_TOKENS = 12
# Short questions. Measured greedy answers (12 tokens, MiniLM cosine to ref-f32):
# int4-g64 words these differently (0.37-0.85: failing pairs) ...
DRIFTING = [
    "What is 7 times 8?",
    "Who wrote Hamlet?",
    "What do bees make?",
    "Which planet is known as the red planet?",
    "Name three primary colors.",
]
# ... while int8 answers these word for word as ref-f32 does (cosine 1.0: passing probes).
STABLE = [
    "What is the capital of France?",
    "What is 7 times 8?",
    "Who wrote Hamlet?",
    "What is the boiling point of water in Celsius?",
]
# Fast: two failing pairs roll back, a short cool-down, two passing probes restore.
POLICY = {
    "rules": ["consecutive"],
    "consecutive_failures": 2,
    "min_pairs": 2,
    "cooldown_s": 12.0,
    "cooldown_backoff": 1.0,
    "half_open_pairs": 2,
    "teacher_forced": False,
}


async def test_rollback_restore_and_console_through_the_real_gateway(
    stack: EmbeddedStack,
    redis_prefix: str,
    tmp_path: Path,
) -> None:
    pytest.importorskip("transformers")
    started = time.monotonic()
    policy = tmp_path / "policy.yaml"
    policy.write_text(yaml.safe_dump({"default": POLICY}))
    settings = isolated_settings(stack, redis_prefix).model_copy(update={"policy_file": policy})
    await make_topics(settings)
    kafka = settings.kafka
    env = settings_env(settings, stack.redis_url)
    verifier = verifier_from_settings(settings.signing.keys)

    cand_port, ref_port, gw_port = free_port(), free_port(), free_port()
    config = tmp_path / "gateway.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "precisions": {
                    "int4": [f"http://127.0.0.1:{cand_port}"],
                    "bf16": [f"http://127.0.0.1:{ref_port}"],
                },
                "routes": {
                    ROUTE: {"candidate": "int4", "reference": "bf16", "teacher_forced": False}
                },
                "default_route": ROUTE,
                "default_preference": "cost_optimized",
                "shadow_sample_rate": 1.0,
                "noise_sample_rate": 0.0,
                "timeouts": {"connect_s": 2, "read_s": 120, "total_s": 180, "shadow_total_s": 180},
            },
            sort_keys=False,  # precisions in fallback order: the candidate first
        )
    )
    candidate = lab(tmp_path, "candidate-int4-g64", "int4-g64", cand_port)
    reference = lab(tmp_path, "reference-ref-f32", "ref-f32", ref_port)
    worker = start_worker(settings, stack.redis_url)
    gateway = Child(
        "gateway", ["gateway", "--config", str(config), "--port", str(gw_port)], tmp_path, env
    )
    gateway.start()
    children = [candidate, reference, gateway]
    watch = ControlWatch(kafka.bootstrap_servers, kafka.topics.control, verifier.open)
    base = f"http://127.0.0.1:{gw_port}"
    http = httpx.AsyncClient(base_url=base, timeout=5.0)
    client = openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="unused", timeout=180, max_retries=0)
    replies: list[Reply] = []
    try:
        await watch.start()
        await asyncio.gather(
            candidate.healthy(f"http://127.0.0.1:{cand_port}/health", 300),
            reference.healthy(f"http://127.0.0.1:{ref_port}/health", 300),
            gateway.healthy(f"{base}/health", 120),
        )
        up = time.monotonic() - started

        # 1. Shadowed SDK traffic until the breaker rolls back.
        rolled_back: asyncio.Task[Seen] = asyncio.create_task(watch.wait("rollback", 0, 240))

        async def first_on_reference() -> tuple[float, Reply]:
            """The moment /health says bf16, send a request alongside the one in flight."""
            _, flipped = await until_gateway(http, lambda r: r["serving"] == "bf16", 240, "bf16")
            return flipped, await ask(client, DRIFTING[0])

        switched = asyncio.create_task(first_on_reference())
        i = 0
        while not rolled_back.done():
            assert i < 40, f"no rollback after {i} requests:\n{worker.log_tail()}"
            reply = await ask(client, DRIFTING[i % len(DRIFTING)])
            assert reply.status == 200
            replies.append(reply)
            i += 1
        rollback = await rolled_back
        assert rollback.command.target == "reference"
        flipped_at, first_bf16 = await switched
        assert (first_bf16.status, first_bf16.precision) == (200, "bf16")
        decisive = rollback.command.evidence["decisive_pair_id"]
        pairs = await records_for(kafka.bootstrap_servers, kafka.topics.pairs, ROUTE)
        decisive_at = next(
            r.timestamp / 1000 for r in pairs if PairEvent.parse(r.value).pair_id == decisive
        )
        after = [await ask(client, p) for p in DRIFTING[1:3]]
        assert [(r.status, r.precision) for r in after] == [(200, "bf16")] * 2
        served_int4 = [r.precision for r in replies]
        assert served_int4[0] == "int4"

        # 2. Swap the candidate for int8 on the same port while the route is open.
        candidate.stop()
        candidate = lab(tmp_path, "candidate-int8", "int8", cand_port)
        children[0] = candidate
        await candidate.healthy(f"http://127.0.0.1:{cand_port}/health", 300)
        canary = await watch.wait("canary", rollback.command.epoch, 120)
        await until_gateway(http, lambda r: r["mode"] == "half_open", 10, "half-open")
        restored_task = asyncio.create_task(watch.wait("restore", canary.command.epoch, 240))
        half_open: list[Reply] = []
        while not restored_task.done():
            assert len(half_open) < 12, f"int8 never restored:\n{worker.log_tail()}"
            half_open.append(await ask(client, STABLE[len(half_open) % len(STABLE)]))
        restore = await restored_task
        assert restore.command.target == "candidate"
        assert half_open[0].status == 200 and half_open[0].precision == "bf16"
        await until_gateway(
            http, lambda r: r["epoch"] >= restore.command.epoch, 10, "the restore applied"
        )
        back = await ask(client, STABLE[0])
        assert (back.status, back.precision) == (200, "int4")
        probe_pairs = [
            PairEvent.parse(r.value)
            for r in await records_for(kafka.bootstrap_servers, kafka.topics.pairs, ROUTE)
            if r.timestamp / 1000 > canary.published
        ]
        assert probe_pairs and all(p.candidate.precision == "int4" for p in probe_pairs)

        # 3. The console, one command at a time, each followed by a 200 on its side.
        console = []
        epoch = restore.command.epoch
        for action, side in (("rollback", "bf16"), ("restore", "int4"), ("release", "int4")):
            done = subprocess.run(
                [sys.executable, "-m", "quantdrift", "route", action, "--route", ROUTE],
                env=child_env(env),
                cwd=tmp_path,
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert done.returncode == 0, done.stdout + done.stderr
            route_view, _ = await until_gateway(
                http, lambda r, e=epoch: r["epoch"] > e, 10, f"the console's {action}"
            )
            epoch = route_view["epoch"]
            reply = await ask(client, STABLE[0])
            assert (reply.status, reply.precision) == (200, side), (action, reply)
            console.append(f"{action}->{reply.precision}")

        print(
            f"\nupstreams and gateway up in {up:.0f}s; rollback after {len(replies)} requests "
            f"(served {','.join(served_int4)}); decisive pair published -> rollback on the "
            f"control topic {1000 * (rollback.published - decisive_at):.0f} ms -> gateway "
            f"serving bf16 {1000 * (flipped_at - decisive_at):.0f} ms -> first SDK request to "
            f"bf16 sent +{1000 * (first_bf16.sent - decisive_at):.0f} ms, answered (12 tokens "
            f"on CPU) +{1000 * (first_bf16.ended - decisive_at):.0f} ms; half-open served "
            f"{','.join(r.precision for r in half_open)} with int8 in shadow, restored; "
            f"console {' '.join(console)}; {time.monotonic() - started:.0f}s"
        )
    finally:
        await watch.stop()
        await http.aclose()
        await client.close()
        for child in children:
            child.stop()
        worker.stop()
        print(json.dumps({"logs": str(tmp_path)}))
