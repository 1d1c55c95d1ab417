"""What the gateway adds in front of real vLLM: TTFT and TPOT, direct vs through it.

    python bench/gateway_vllm.py [--requests 40] [--tokens 64] [--json] [--write BENCHMARKS.md]

Starts one real engine with ``quantdrift lab vllm`` (``int4-g64-gptq``, the GPTQ
W4A16 checkpoint on vLLM's int4 kernel, where this CPU has it; else ``int4-g64``, the
same weights dequantized: ``vllm_server.int4_candidate``; ``.venv-vllm`` from ``make
vllm``), then
sends the same sequential streamed greedy chat requests, in one run:

* ``direct``: to the engine itself (the baseline);
* ``gateway``: through the gateway (in this process, on uvicorn), shadowing off,
  the default 48-token hold-back (TTFT includes it: the price of a silent
  fallback in the first tokens);
* ``gateway, holdback 0``: the hold-back off, the gateway alone;
* ``gateway+shadow``: every request also mirrored to the same engine as the
  reference, in the background, pairs offered to a publisher whose broker is not
  there (dropped and counted), so the engine serves twice the work.

TTFT is the time to the first content chunk; TPOT is the time from it to the last
content chunk over the chunks between (vLLM streams one token per chunk). Rows give
p50/p99 and the p50 added over ``direct``.

Then **the cost of teacher forcing on the reference**: for each of the same number
of answers (greedy, non-streamed, with log-probs), the gateway's own vLLM
teacher-forcing call (``gateway.teacher_forcing.score_vllm``: ``/tokenize`` and a
``prompt_logprobs`` chat, what a shadow pair costs the reference) is timed against
the time the engine took to generate that answer, one request at a time on an
otherwise idle engine. Each answer is generated for its prompt with a suffix and
forced under the prompt itself, so the prefix cache holds the prompt's blocks at
most, as when a reference forces a candidate's answer, never the answer's. It
reports how many answers aligned token for token.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from common import write_section
from gateway_serving import dead_broker_publisher, quiet_logs, serving

from quantdrift.gateway.gateway_config import parse_config
from quantdrift.gateway.http.service import Gateway
from quantdrift.gateway.upstream import teacher_forcing
from quantdrift.gateway.upstream.client import PoolClient
from quantdrift.lab.vllm_process import start_engine, wait_ready
from quantdrift.lab.vllm_server import int4_candidate
from quantdrift.stack import free_port

SECTION = "## Gateway overhead in front of vLLM"
# The GPTQ checkpoint on vLLM's int4 kernel where this CPU has it, else the same int4
# weights dequantized (an AVX2-only CPU: ``lab vllm`` refuses GPTQ there).
VARIANT = int4_candidate()
PROMPT = "Explain in a few sentences why the sky is blue."


def _content(line: str) -> bool:
    if not line.startswith("data: {"):
        return False
    choices = json.loads(line[6:]).get("choices") or []
    return any((c.get("delta") or {}).get("content") for c in choices)


async def measure(url: str, n: int, tokens: int, warmup: int = 3) -> list[tuple[float, float]]:
    """(ttft, tpot) seconds of ``n`` sequential streamed requests."""
    body = {
        "model": VARIANT,
        "messages": [{"role": "user", "content": PROMPT}],
        "stream": True,
        "temperature": 0,
        "max_tokens": tokens,
    }
    out: list[tuple[float, float]] = []
    async with httpx.AsyncClient(base_url=url, timeout=300) as client:
        for i in range(n + warmup):
            t0 = time.perf_counter()
            stamps: list[float] = []
            async with client.stream("POST", "/v1/chat/completions", json=body) as r:
                if r.status_code != 200:
                    raise SystemExit(f"{url}: HTTP {r.status_code}: {await r.aread()!r}")
                async for line in r.aiter_lines():
                    if _content(line):
                        stamps.append(time.perf_counter())
            if i >= warmup and len(stamps) > 1:
                tpot = (stamps[-1] - stamps[0]) / (len(stamps) - 1)
                out.append((stamps[0] - t0, tpot))
    return out


async def through_gateway(
    engine: str, n: int, tokens: int, shadow: bool, holdback: int
) -> list[tuple[float, float]]:
    config = parse_config(
        {
            "precisions": {"int4": [engine], "bf16": [engine]},
            "precision_models": {"int4": VARIANT, "bf16": VARIANT},
            "routes": {"bench/int4": {"candidate": "int4", "reference": "bf16"}},
            "shadow_sample_rate": 1.0 if shadow else 0.0,
            "stream_holdback_tokens": holdback,
            "timeouts": {"read_s": 300, "total_s": 300, "shadow_total_s": 300},
        }
    )
    gateway = Gateway(config, publisher=dead_broker_publisher())
    async with serving(gateway) as url:
        result = await measure(url, n, tokens)
        await gateway.wait_shadows(120)
    return result


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


TF_PROMPTS = [
    "Explain in a few sentences why the sky is blue.",
    "Write a short paragraph about the history of the bicycle.",
    "List three uses of copper and say why each needs it.",
    "Describe how a refrigerator keeps food cold.",
]


async def forcing_cost(url: str, n: int, tokens: int) -> dict[str, Any]:
    """(generation s, forced-score s) per answer, sequential, and the alignment count."""
    gen_s: list[float] = []
    tf_s: list[float] = []
    aligned = 0
    # The forced scoring goes through the gateway's own connection pool, as it does live.
    pool = PoolClient(4, connect_s=5.0, read_s=300.0, acquire_s=5.0)
    async with httpx.AsyncClient(base_url=url, timeout=300) as client:
        for i in range(n):
            prompt = TF_PROMPTS[i % len(TF_PROMPTS)]
            messages = [{"role": "user", "content": prompt}]
            body = {
                "model": VARIANT,
                # Generated for a slightly different prompt: the engine's prefix cache
                # must not already hold the answer's blocks when it is forced (in
                # production the reference never generated the candidate's answer).
                "messages": [{"role": "user", "content": f"{prompt} ({i})"}],
                "temperature": 0,
                "max_tokens": tokens,
                "logprobs": True,
                "top_logprobs": 1,
            }
            t0 = time.perf_counter()
            r = await client.post("/v1/chat/completions", json=body)
            gen = time.perf_counter() - t0
            if r.status_code != 200:
                raise SystemExit(f"{url}: HTTP {r.status_code}: {r.text[:300]}")
            choice = r.json()["choices"][0]
            answer = choice["message"]["content"] or ""
            toks = [e["token"] for e in (choice.get("logprobs") or {}).get("content") or []]
            t1 = time.perf_counter()
            got = await teacher_forcing.score_vllm(
                pool, url, VARIANT, messages, answer, toks,
                choice.get("finish_reason") == "stop", 300.0,
            )  # fmt: skip
            tf_s.append(time.perf_counter() - t1)
            gen_s.append(gen)
            aligned += isinstance(got, teacher_forcing.Scored)
    await pool.aclose()
    return {
        "answers": n,
        "aligned": aligned,
        "generation_p50_ms": round(pct(gen_s, 0.5) * 1000, 1),
        "forced_p50_ms": round(pct(tf_s, 0.5) * 1000, 1),
        "forced_p99_ms": round(pct(tf_s, 0.99) * 1000, 1),
        "forced_over_generation": round(sum(tf_s) / sum(gen_s), 3),
    }


async def run(args: argparse.Namespace, engine: str) -> dict[str, list[tuple[float, float]]]:
    runs: dict[str, list[tuple[float, float]]] = {}
    runs["direct"] = await measure(engine, args.requests, args.tokens)
    runs["gateway"] = await through_gateway(engine, args.requests, args.tokens, False, 48)
    runs["gateway, holdback 0"] = await through_gateway(
        engine, args.requests, args.tokens, False, 0
    )
    runs["gateway+shadow"] = await through_gateway(engine, args.requests, args.tokens, True, 48)
    return runs


def rows_of(runs: dict[str, list[tuple[float, float]]]) -> list[dict[str, Any]]:
    base_ttft = pct([t for t, _ in runs["direct"]], 0.5)
    base_tpot = pct([p for _, p in runs["direct"]], 0.5)
    rows = []
    for name, values in runs.items():
        ttft, tpot = [t for t, _ in values], [p for _, p in values]
        rows.append(
            {
                "path": name,
                "requests": len(values),
                "ttft_p50_ms": round(pct(ttft, 0.5) * 1000, 1),
                "ttft_p99_ms": round(pct(ttft, 0.99) * 1000, 1),
                "tpot_p50_ms": round(pct(tpot, 0.5) * 1000, 2),
                "tpot_p99_ms": round(pct(tpot, 0.99) * 1000, 2),
                "added_ttft_p50_ms": round((pct(ttft, 0.5) - base_ttft) * 1000, 1),
                "added_tpot_p50_ms": round((pct(tpot, 0.5) - base_tpot) * 1000, 2),
            }
        )
    return rows


def markdown(result: dict[str, Any]) -> str:
    lines = [
        SECTION,
        "",
        f"`python bench/gateway_vllm.py --requests {result['requests']} --tokens "
        f"{result['tokens']}`: one real vLLM {result['engine'].get('version')} engine "
        f"serving `{VARIANT}` (CPU build), sequential streamed greedy chat requests of "
        f"{result['tokens']} tokens; client and gateway in one process. TTFT through the "
        "gateway includes the 48-token hold-back; `holdback 0` shows the gateway alone; "
        "`gateway+shadow` mirrors every request to the same engine.",
        "",
        "| path | TTFT p50 ms | TTFT p99 ms | TPOT p50 ms | TPOT p99 ms "
        "| added TTFT p50 | added TPOT p50 |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in result["rows"]:
        lines.append(
            f"| {r['path']} | {r['ttft_p50_ms']} | {r['ttft_p99_ms']} | {r['tpot_p50_ms']} "
            f"| {r['tpot_p99_ms']} | {r['added_ttft_p50_ms']} | {r['added_tpot_p50_ms']} |"
        )
    tf = result.get("teacher_forcing") or {}
    lines.append("")
    if "error" in tf:
        lines.append(f"Teacher-forcing cost: not measured ({tf['error']}).")
    else:
        lines.append(
            f"Teacher forcing on the reference (the gateway's own `score_vllm`: `/tokenize` "
            f"and a `prompt_logprobs` chat), {tf['answers']} greedy answers of up to "
            f"{result['tokens']} tokens one at a time on the idle engine: forced-score "
            f"p50 {tf['forced_p50_ms']} ms, p99 {tf['forced_p99_ms']} ms, against "
            f"{tf['generation_p50_ms']} ms p50 to generate the answer: "
            f"**{tf['forced_over_generation']:.0%} of the generation's time** per shadow "
            f"pair; {tf['aligned']} of {tf['answers']} aligned token for token."
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--write", type=Path, default=None)
    args = parser.parse_args()
    if not 1 <= args.requests <= 1000:
        sys.exit("--requests must be in 1..1000")
    quiet_logs()
    with tempfile.TemporaryDirectory(prefix="qd-gateway-vllm-") as tmp:
        engine = start_engine(VARIANT, free_port(), Path(tmp), 1500)
        try:
            wait_ready([engine], 1560)
            runs = asyncio.run(run(args, engine.url))
            try:
                forcing: dict[str, Any] = asyncio.run(
                    forcing_cost(engine.url, args.requests, args.tokens)
                )
            except Exception as exc:  # the TTFT rows stand on their own; say what failed
                forcing = {"error": f"{type(exc).__name__}: {exc}"[:300]}
        finally:
            engine.stop()
    ready = engine.ready or {}
    result = {
        "requests": args.requests,
        "tokens": args.tokens,
        "engine": {k: ready.get(k) for k in ("version", "startup_s")},
        "rows": rows_of(runs),
        "teacher_forcing": forcing,
    }
    text = markdown(result)
    if args.write:
        write_section(args.write, text, SECTION)
    if args.json:
        print(json.dumps({"bench": "gateway_vllm", **result}))
    else:
        print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
