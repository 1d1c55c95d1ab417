"""Several builds judged side by side on real vLLM engines: the cheapest one that passes.

    python bench/side_by_side_vllm.py --engines ENGINES.txt [--reference ref-f32]
        [--candidate int8] [--extra int4-g64-gptq --extra int3-g64] [--cost int8=8 ...]
        [--prompts 80] [--concurrency 4] [--json] [--write BENCHMARKS.md]

``ENGINES.txt`` names engines already running, one ``NAME=URL`` a line (what ``lab
corpus record --engine`` takes); this starts none. The route's ``candidate`` serves the
users; each ``--extra`` is an extra candidate judged on the same sampled requests
(``extra_candidates``): per request the reference answers **once**, every build is
asked, the reference teacher-forces each build's answer (``teacher_forcing: vllm``, on
the candidates' own token ids), and each build's pair goes under its own route id.

Everything past the engines is the project's own: the embedded stack (broker and
Redis), a real ``quantdrift worker`` child with the default policy, the gateway
(``Gateway`` on uvicorn in this process, its publisher on the stack's broker, every
request shadowed, a share of them noise pairs for the floor), requests from the
``openai`` SDK, and the report is ``quantdrift shadow report`` (run as a user runs it,
on the config file this writes) once every build's pairs are judged. The gateway runs
without route control: a build the breaker opens keeps being judged (users stay on the
route's candidate), since the question here is which build passes, not the rollback.

Prompts: the first ``--prompts`` *sampled* prompts of ``corpus/prompts.jsonl.gz`` of
at most ``--max-input-tokens`` (a forced pass over a long prompt holds a
full-vocabulary row per position), T 0.7, top-p 0.9, no seed (see ``_sampling``), at most
``--max-tokens`` new tokens: one decoding mode, so the noise pairs fill one floor.
``--concurrency`` bounds the requests in flight, and the gateway's
``shadow_concurrency`` the shadow jobs, so engines busy with other work (a recording)
are not swamped.

Cost (``--cost NAME=X``): weight bits by default where the name says them (``int8``
8, ``int4`` 4, ``int3`` 3); the report ranks passing builds cheapest first.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import yaml
from common import finish, machine
from e2e import bench_settings
from gateway_serving import quiet_logs, serving

from quantdrift.demo.workers import WorkerProcess, settings_env
from quantdrift.gateway.gateway_config import candidate_route, parse_config
from quantdrift.gateway.http.service import Gateway
from quantdrift.gateway.shadow.publisher import ShadowPublisher
from quantdrift.services.console import route_status
from quantdrift.stack import EmbeddedStack
from quantdrift.stack.broker import create_topics

SECTION = "## Side by side on vLLM"
ROOT = Path(__file__).resolve().parents[1]
ROUTE = "corpus/side-by-side"
TEMPERATURE, TOP_P = 0.7, 0.9


def read_engines(path: Path) -> dict[str, str]:
    """``NAME=URL`` lines (blank lines and ``#`` comments skipped)."""
    out = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, url = line.partition("=")
        if not sep or not url.startswith("http"):
            raise SystemExit(f"{path}: expected NAME=URL, got {line!r}")
        out[name.strip()] = url.strip().rstrip("/")
    return out


def default_cost(name: str) -> float | None:
    """Weight bits where the build's name says them (``int4-gptq`` -> 4)."""
    m = re.search(r"int(\d+)", name)
    return float(m.group(1)) if m else None


def sampled_prompts(n: int, max_input_tokens: int) -> list[dict[str, Any]]:
    """The corpus's first ``n`` sampled prompts of at most ``max_input_tokens``."""
    out = []
    with gzip.open(ROOT / "corpus" / "prompts.jsonl.gz", "rt") as f:
        for line in f:
            p = json.loads(line)
            if p["decoding"] == "sampled" and p["input_tokens"] <= max_input_tokens:
                out.append(p)
                if len(out) == n:
                    break
    return out


async def served_model(url: str) -> str:
    async with httpx.AsyncClient(timeout=30) as client:
        models = (await client.get(url + "/v1/models")).json()["data"]
    return str(models[0]["id"])


def gateway_config(
    engines: dict[str, str], models: dict[str, str], args: argparse.Namespace
) -> dict[str, Any]:
    builds = [args.candidate, *args.extra]
    costs = {b: default_cost(b) for b in builds} | dict(args.cost)
    pools: dict[str, Any] = {
        b: {"logprobs": True, "max_top_logprobs": 5, "token_ids": True,
            **({"cost": costs[b]} if costs.get(b) is not None else {})}
        for b in builds
    }  # fmt: skip
    pools[args.reference] = {"logprobs": True, "max_top_logprobs": 5, "teacher_forcing": "vllm"}
    return {
        "precisions": {n: [engines[n]] for n in (*builds, args.reference)},
        "precision_models": {n: models[n] for n in (*builds, args.reference)},
        "pools": pools,
        "routes": {
            ROUTE: {
                "candidate": args.candidate,
                "reference": args.reference,
                "teacher_forced": True,
                "extra_candidates": list(args.extra),
            }
        },
        "shadow_sample_rate": 1.0,
        "noise_sample_rate": args.noise,
        "noise_fill": {"max_rate": 0.0},
        "shadow_concurrency": args.concurrency,
        "shadow_queue": 4 * args.prompts,
        "sample_salt": "side-by-side-vllm-bench-salt-0123",
        # The engines are shared with other work: room for slow answers.
        "timeouts": {"connect_s": 10, "read_s": 600, "total_s": 900, "chain_s": 900,
                     "shadow_total_s": 1800},
        "overload": {"max_loop_lag_s": 30.0},
        # The users' answers as the candidate gave them (a loop is the evidence here).
        "degeneration": {"enabled": False},
    }  # fmt: skip


def request_options(prompt: dict[str, Any], max_tokens: int) -> dict[str, Any]:
    """A request's sampling options. No ``seed``: vLLM 0.32's CPU build kills its engine
    core on a seeded request whose prefill is chunked ("CPU Generator does not use
    offset"; ``lab/corpus/record.py``), and most traffic carries none.

    >>> request_options({"max_tokens": 96}, 64)
    {'max_tokens': 64, 'temperature': 0.7, 'top_p': 0.9}
    """
    return {
        "max_tokens": min(int(prompt["max_tokens"]), max_tokens),
        "temperature": TEMPERATURE,
        "top_p": TOP_P,
    }


async def drive(
    base: str, prompts: list[dict[str, Any]], args: argparse.Namespace, served_by: Counter[str]
) -> list[float]:
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=900)
    gate = asyncio.Semaphore(args.concurrency)
    seconds: list[float] = []

    async def one(i: int, p: dict[str, Any]) -> None:
        async with gate:
            t0 = time.monotonic()
            reply = await client.chat.completions.with_raw_response.create(
                model=ROUTE,
                messages=p["messages"],
                **request_options(p, args.max_tokens),
            )
            # A failed candidate call falls back down the chain (counted, as served).
            served_by[reply.headers["x-quantdrift-precision"]] += 1
            fallbacks = reply.headers.get("x-quantdrift-fallbacks")
            if fallbacks:
                print(f"  request {i}: fell back ({fallbacks})", file=sys.stderr)
            seconds.append(time.monotonic() - t0)
            if len(seconds) % 10 == 0:
                print(f"  {len(seconds)}/{len(prompts)} answered", file=sys.stderr)

    await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))
    await client.close()
    return seconds


def report(settings: Any, config_file: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **settings_env(settings, settings.redis.url or "")}
    return subprocess.run(
        [sys.executable, "-m", "quantdrift", "shadow", "report", "--config", str(config_file),
         "--route", ROUTE, *extra],
        capture_output=True, text=True, env=env, timeout=120, check=False,
    )  # fmt: skip


async def until_judged(
    settings: Any, routes: list[str], want: int, worker: WorkerProcess, timeout: float
) -> dict[str, int]:
    """Each build's shadow pairs judged, once every build has ``want`` (or time is up)."""
    deadline = time.monotonic() + timeout
    while True:
        rows = {r["route"]: int(r["pairs_seen"]) for r in await route_status(settings)}
        seen = {r: rows.get(r, 0) for r in routes}
        if min(seen.values()) >= want or time.monotonic() > deadline:
            return seen
        if not worker.alive():
            raise RuntimeError("worker died:\n" + worker.log_tail())
        await asyncio.sleep(2)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    engines = read_engines(args.engines)
    builds = [args.candidate, *args.extra]
    missing = [n for n in (*builds, args.reference) if n not in engines]
    if missing:
        raise SystemExit(f"not in {args.engines}: {missing}; it names {sorted(engines)}")
    models = {n: await served_model(engines[n]) for n in (*builds, args.reference)}
    prompts = sampled_prompts(args.prompts, args.max_input_tokens)
    data = gateway_config(engines, models, args)
    work = Path(tempfile.mkdtemp(prefix="qd-side-by-side-"))
    with EmbeddedStack(redis_probe_url=None) as stack:
        settings = bench_settings(stack)
        settings = settings.model_copy(update={"policy_file": args.policy})
        topics = settings.kafka.topics.model_dump().values()
        await create_topics(stack.bootstrap, topics, settings.kafka.partitions)
        worker = WorkerProcess(settings, stack.redis_url).start()
        config_file = work / "gateway.yaml"
        config_file.write_text(yaml.safe_dump(data, sort_keys=False))
        publisher = ShadowPublisher(settings.kafka, 1.0, queue_size=8 * args.prompts)
        gw = Gateway(parse_config(data), publisher=publisher)
        t0 = time.monotonic()
        try:
            async with serving(gw) as base:
                served_by: Counter[str] = Counter()
                served = await drive(base, prompts, args, served_by)
                answered_s = time.monotonic() - t0
                if not await gw.shadow.wait_idle(args.shadow_timeout):
                    raise RuntimeError(f"shadow jobs still running after {args.shadow_timeout} s")
                shadowed_s = time.monotonic() - t0
                # The gateway serves from this process's event loop: a blocking call here
                # would wait on itself, so its health is read without blocking the loop.
                async with httpx.AsyncClient(timeout=10) as client:
                    health = (await client.get(base + "/health")).json()
                routes = [ROUTE, *(candidate_route(ROUTE, b) for b in args.extra)]
                judged = await until_judged(settings, routes, len(prompts), worker, 300)
            text = report(settings, config_file)
            as_json = report(settings, config_file, "--json")
        finally:
            worker.stop()
    spend = health["routes"][ROUTE]
    forced = {
        b: (spend if b == args.candidate else spend["extra_candidates"][b])["shadow_spend"]
        for b in builds
    }
    out = json.loads(as_json.stdout)
    return {
        "machine": machine(),
        "uptime": subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip(),
        "command": "python bench/side_by_side_vllm.py " + " ".join(sys.argv[1:]),
        "engines": {n: models[n] for n in (*builds, args.reference)},
        "prompts": len(prompts),
        "max_tokens": args.max_tokens,
        "max_input_tokens": args.max_input_tokens,
        "concurrency": args.concurrency,
        "noise_sample_rate": args.noise,
        "answered_s": round(answered_s, 1),
        "shadowed_s": round(shadowed_s, 1),
        "served_by": dict(served_by),
        "user_p50_s": round(sorted(served)[len(served) // 2], 2),
        "reference_shadow_calls": spend["shadow_spend"]["reference"]["shadow"]["calls"],
        "teacher_forcing": {
            b: f["reference"].get("teacher_forcing", {}).get("calls", 0) for b, f in forced.items()
        },
        "judged": judged,
        "report_exit": text.returncode,
        "report_text": text.stdout.strip(),
        "report": out,
    }


def render(r: dict[str, Any]) -> str:
    engines = ", ".join(f"{k} = `{v}`" for k, v in r["engines"].items())
    about = (
        f"`{r['command']}` ({r['uptime']}). Engines: {engines}; {r['prompts']} sampled "
        f"corpus prompts of at most {r['max_input_tokens']} input tokens, at most "
        f"{r['max_tokens']} new tokens, {r['concurrency']} requests in flight, every "
        f"request shadowed, noise share {r['noise_sample_rate']}. Reference "
        f"answers for shadow pairs: {r['reference_shadow_calls']} (one per request, for "
        f"every build). Users answered in {r['answered_s']} s (p50 {r['user_p50_s']} s a "
        f"request; served by {r['served_by']}), every shadow job done at "
        f"{r['shadowed_s']} s."
    )
    best = r["report"]["cheapest_passing"] or "none"
    rows = "\n".join(
        f"| {c['pool']} | {c['route']} | {c['cost']} | {c['verdict']} | {c['pairs']} | "
        f"{r['teacher_forcing'].get(c['pool'], 0)} | {c['reason']} |"
        for c in r["report"]["candidates"]
    )
    head = "| build | route id | cost (weight bits) | verdict | pairs judged | forced | reason |"
    return (
        f"{SECTION}\n\n{about}\n\nCheapest passing build: **{best}** (`quantdrift shadow "
        f"report` exit {r['report_exit']}).\n\n{head}\n|---|---|---|---|---|---|---|\n"
        f"{rows}\n\n```\n{r['report_text']}\n```\n"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--engines", type=Path, required=True)
    parser.add_argument("--reference", default="ref-f32")
    parser.add_argument("--candidate", default="int8")
    parser.add_argument("--extra", action="append", default=None)
    parser.add_argument(
        "--cost", action="append", default=[],
        type=lambda s: (s.partition("=")[0], float(s.partition("=")[2])),
    )  # fmt: skip
    parser.add_argument("--prompts", type=int, default=80)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--max-input-tokens", type=int, default=1024)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--noise", type=float, default=0.3)
    parser.add_argument("--policy", type=Path, default=None)
    parser.add_argument("--shadow-timeout", type=float, default=3600)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--write", type=Path, default=None)
    args = parser.parse_args()
    if args.extra is None:
        args.extra = ["int4-g64-gptq", "int3-g64"]
    if args.concurrency > 4:
        parser.error("--concurrency above 4 would swamp engines shared with other work")
    quiet_logs()
    result = asyncio.run(run(args))
    return finish(result, render(result), args.write, SECTION, args.json)


if __name__ == "__main__":
    raise SystemExit(main())
