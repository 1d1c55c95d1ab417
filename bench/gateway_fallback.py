"""Fallback rate of the gateway's JSON guard on the lab's real JSON answers, per precision.

Each JSON-task answer the lab recorded (candidate variants and the reference) is
streamed through the gateway's incremental guard exactly as the gateway would
(token-sized chunks, then the close): an answer the guard cuts is a silent retry
on the next precision. This is the per-precision fallback rate users would cause
on these prompts; no server is needed because the answers are recorded.

    python bench/gateway_fallback.py [--pairs PAIRS.jsonl.gz] [--json] [--write BENCHMARKS.md]

``--live`` measures the same live instead: three ``quantdrift lab serve``
processes (int4-g64 -> int8 -> ref-f32) behind a real gateway, the lab's prompts
(JSON and free text, greedy) sent through it, and each precision's fallback
rate read from the answers' ``x-quantdrift-precision`` / ``x-quantdrift-fallbacks``
headers: attempts on a precision are the requests that reached it, fallbacks
those it passed on (guards and upstream failures alike). Loads the model three
times: a few minutes on a CPU.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter, defaultdict
from pathlib import Path

from common import write_section

from quantdrift.gateway.guards.json_guard import guard_for
from quantdrift.schemas import ModelOutput, PairEvent
from quantdrift.services.pairs import read_pairs

SECTION = "## Gateway fallback rate on the lab's JSON prompts"


def guarded(output: ModelOutput, pair: PairEvent) -> str | None:
    """None when the guard lets the streamed answer through, else the reason it cut it."""
    guard = guard_for(
        expected_keys=pair.request.expected_keys, json_schema=pair.request.json_schema
    )
    chunks = output.tokens or [output.text]
    for chunk in chunks:
        result = guard.feed(chunk)
        if not result.ok:
            return result.reason
    result = guard.close()
    return None if result.ok else result.reason


def measure(pairs: list[PairEvent]) -> dict[str, dict[str, object]]:
    """Per precision: answers seen, cut by the guard, and why."""
    seen: dict[str, set[str]] = defaultdict(set)
    cut: Counter[str] = Counter()
    total: Counter[str] = Counter()
    reasons: dict[str, Counter[str]] = defaultdict(Counter)
    for pair in pairs:
        if not (pair.request.expects_json or pair.request.expected_keys):
            continue
        sides = [(pair.candidate.precision or "candidate", pair.candidate)]
        if pair.kind == "shadow":
            sides.append((pair.reference.precision or "reference", pair.reference))
        for precision, output in sides:
            key = f"{pair.request.decoding}:{output.text}"
            if key in seen[precision]:  # the reference answers recur across variants
                continue
            seen[precision].add(key)
            total[precision] += 1
            reason = guarded(output, pair)
            if reason is not None:
                cut[precision] += 1
                reasons[precision][reason] += 1
    return {
        p: {
            "answers": total[p],
            "fallbacks": cut[p],
            "fallback_rate": round(cut[p] / total[p], 3) if total[p] else None,
            "reasons": dict(reasons[p].most_common()),
        }
        for p in sorted(total)
    }


def markdown(result: dict[str, dict[str, object]]) -> str:
    lines = [
        SECTION,
        "",
        "`python bench/gateway_fallback.py`: every JSON-task answer recorded by the lab "
        "(SmolLM2-135M, greedy and sampled), streamed token by token through the gateway's "
        "JSON guard; a cut answer is a silent retry on the next precision.",
        "",
        "| precision | JSON answers | cut by the guard | fallback rate | why |",
        "|---|---:|---:|---:|---|",
    ]
    for p, r in result.items():
        why = ", ".join(f"{k} {v}" for k, v in r["reasons"].items()) or "-"  # type: ignore[union-attr]
        rate = r["fallback_rate"]
        lines.append(
            f"| {p} | {r['answers']} | {r['fallbacks']} | "
            f"{'-' if rate is None else f'{rate:.0%}'} | {why} |"
        )
    return "\n".join(lines) + "\n"


LIVE_SECTION = "## Gateway fallback rate per precision, live (lab serve)"
LIVE_CHAIN = (("int4", "int4-g64"), ("int8", "int8"), ("bf16", "ref-f32"))


def live(max_tokens: int, prompts_per_task: int) -> dict[str, object]:
    """Fallback rate per precision through a real gateway over real lab servers."""
    import asyncio
    import subprocess
    import tempfile
    import time

    import httpx
    import uvicorn

    from quantdrift.data.prompts import PROMPTS
    from quantdrift.gateway.gateway_config import parse_config
    from quantdrift.gateway.http.app import create_app
    from quantdrift.gateway.http.service import Gateway
    from quantdrift.stack import free_port
    from quantdrift.stack.ports import stop_popen

    logs = Path(tempfile.mkdtemp(prefix="qd-fallback-"))
    procs, urls = [], {}
    for name, variant in LIVE_CHAIN:
        port = free_port()
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "quantdrift", "lab", "serve", "--precision", variant,
                 "--port", str(port), "--threads", "1"],
                stdout=(logs / f"{name}.log").open("wb"),
                stderr=subprocess.STDOUT,
            )
        )  # fmt: skip
        urls[name] = f"http://127.0.0.1:{port}"
    picked: dict[str, int] = defaultdict(int)
    prompts = []
    for p in PROMPTS:
        if p.task in ("json", "qa", "support") and picked[p.task] < prompts_per_task:
            picked[p.task] += 1
            prompts.append(p)

    async def run() -> dict[str, object]:
        deadline = time.monotonic() + 600
        async with httpx.AsyncClient(timeout=600) as http:
            for url in urls.values():
                while True:
                    try:
                        if (await http.get(f"{url}/health")).status_code == 200:
                            break
                    except httpx.HTTPError:
                        pass
                    if time.monotonic() > deadline:
                        raise SystemExit(f"lab serve did not come up; logs in {logs}")
                    await asyncio.sleep(1)
        config = parse_config(
            {
                "precisions": {name: [urls[name]] for name, _ in LIVE_CHAIN},
                "routes": {"lab/int4": {"candidate": "int4", "reference": "bf16"}},
                "shadow_sample_rate": 0.0,
                "timeouts": {"connect_s": 2, "read_s": 300, "total_s": 600, "chain_s": 1200},
            }
        )
        port = free_port()
        server = uvicorn.Server(
            uvicorn.Config(create_app(Gateway(config)), host="127.0.0.1", port=port,
                           log_level="critical")
        )  # fmt: skip
        server.install_signal_handlers = lambda: None  # type: ignore[method-assign]
        task = asyncio.create_task(server.serve())
        while not server.started:
            await asyncio.sleep(0.05)
        attempts: Counter[str] = Counter()
        passed_on: Counter[str] = Counter()
        reasons: dict[str, Counter[str]] = defaultdict(Counter)
        by_task: Counter[str] = Counter()
        try:
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=900) as c:
                for p in prompts:
                    body: dict[str, object] = {
                        "messages": [{"role": "user", "content": p.text}],
                        "max_tokens": max_tokens,
                        "temperature": 0,
                    }
                    if p.expected_keys:
                        body["expected_keys"] = list(p.expected_keys)
                    r = await c.post("/v1/chat/completions", json=body)
                    by_task[p.task] += 1
                    for entry in filter(
                        None, r.headers.get("x-quantdrift-fallbacks", "").split(",")
                    ):
                        precision, reason = entry.split(":")[:2]
                        if entry.endswith(":served"):
                            continue
                        attempts[precision] += 1
                        passed_on[precision] += 1
                        reasons[precision][reason] += 1
                    served = r.headers.get("x-quantdrift-precision")
                    if served:
                        attempts[served] += 1
        finally:
            server.should_exit = True
            await task
        return {
            "requests": dict(by_task),
            "max_tokens": max_tokens,
            "precisions": {
                name: {
                    "attempts": attempts[name],
                    "fallbacks": passed_on[name],
                    "fallback_rate": round(passed_on[name] / attempts[name], 3)
                    if attempts[name] else None,
                    "reasons": dict(reasons[name].most_common()),
                }
                for name, _ in LIVE_CHAIN
            },
        }  # fmt: skip

    try:
        return asyncio.run(run())
    finally:
        for proc in procs:
            stop_popen(proc, timeout=10)


def live_markdown(result: dict[str, object]) -> str:
    asked = ", ".join(f"{n} {task}" for task, n in result["requests"].items())  # type: ignore[attr-defined]
    lines = [
        LIVE_SECTION,
        "",
        "`python bench/gateway_fallback.py --live`: three `quantdrift lab serve` processes "
        "(SmolLM2-135M int4-g64 -> int8 -> ref-f32) behind the gateway; the lab's JSON, Q&A "
        f"and support prompts ({asked}), greedy, max_tokens "
        f"{result['max_tokens']}. A fallback is any attempt the gateway passed on "
        "(guards and upstream failures); the last precision is served as it is.",
        "",
        "| precision | attempts | passed on | fallback rate | why |",
        "|---|---:|---:|---:|---|",
    ]
    for name, r in result["precisions"].items():  # type: ignore[attr-defined]
        rate = r["fallback_rate"]
        why = ", ".join(f"{k} {v}" for k, v in r["reasons"].items()) or "-"
        lines.append(
            f"| {name} | {r['attempts']} | {r['fallbacks']} | "
            f"{'-' if rate is None else f'{rate:.0%}'} | {why} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=Path, default=None, help="default: the shipped lab pairs")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--write", type=Path, default=None)
    ap.add_argument("--live", action="store_true", help="through lab serve and the gateway")
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--prompts-per-task", type=int, default=5)
    args = ap.parse_args(argv)
    if args.live:
        got = live(args.max_tokens, args.prompts_per_task)
        text = live_markdown(got)
        if args.write:
            write_section(args.write, text, LIVE_SECTION)
        if args.json:
            sys.stdout.write(json.dumps({"bench": "gateway_fallback_live", **got}) + "\n")
        else:
            sys.stdout.write(text)
        return 0
    result = measure(read_pairs(args.pairs))
    text = markdown(result)
    if args.write:
        write_section(args.write, text, SECTION)
    if args.json:
        sys.stdout.write(json.dumps({"bench": "gateway_fallback", "precisions": result}) + "\n")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
