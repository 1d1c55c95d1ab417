"""bf16 or float32 for vLLM on this CPU? One engine folder served both ways, timed alike.

    python bench/vllm_dtype.py MODEL_DIR [--port 38201] [--json]

Starts vLLM from ``.venv-vllm`` (the same flags as ``quantdrift lab vllm``) once per
dtype, waits for ``/v1/models``, then sends three rounds of 16 chat requests of 16
tokens at once and four one at a time. ``lab vllm`` serves float32 where the CPU has no
AVX-512 (``EngineCaps.dtype``): there bf16 is emulated, and this measures what that
costs. Engine start is about 3 minutes each on 2 cores.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from quantdrift.lab.vllm_server import engine_command, find_python, stop_group

ROUNDS, AT_ONCE, SEQUENTIAL, TOKENS = 3, 16, 4, 16


async def measure(port: int) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=300) as client:

        async def one(i: int) -> int:
            reply = await client.post(
                "/v1/chat/completions",
                json={
                    "model": "m",
                    "messages": [
                        {"role": "user", "content": f"Question {i}: the capital of France?"}
                    ],
                    "max_tokens": TOKENS,
                    "temperature": 0,
                },
            )
            return reply.status_code

        rounds = []
        for _ in range(ROUNDS):
            t0 = time.perf_counter()
            codes = await asyncio.gather(*(one(i) for i in range(AT_ONCE)))
            assert set(codes) == {200}, codes
            rounds.append(round(time.perf_counter() - t0, 2))
        t0 = time.perf_counter()
        for i in range(SEQUENTIAL):
            assert await one(i) == 200
        return {
            "rounds_s": rounds,
            "sequential_s_per_request": round((time.perf_counter() - t0) / SEQUENTIAL, 2),
        }


def serve(python: Path, model: Path, dtype: str, port: int) -> dict[str, Any]:
    cmd = engine_command(
        python, model, "m", host="127.0.0.1", port=port, max_model_len=2048, max_num_seqs=16,
        dtype=dtype,
    )  # fmt: skip
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="2", OMP_NUM_THREADS="1")
    t0 = time.monotonic()
    proc = subprocess.Popen(
        cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    try:
        while True:
            assert proc.poll() is None, f"vLLM ({dtype}) exited with {proc.returncode}"
            try:
                if httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(1)
        return {
            "dtype": dtype,
            "startup_s": round(time.monotonic() - t0, 1),
            **asyncio.run(measure(port)),
        }
    finally:
        # The whole group, EngineCore included, before the next dtype's engine starts.
        stop_group(proc)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", type=Path, help="an exported folder (quantdrift lab export)")
    ap.add_argument("--port", type=int, default=38201)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    python = find_python()
    if python is None:
        sys.exit("no .venv-vllm: run `make vllm`")
    rows = [serve(python, args.model, dtype, args.port) for dtype in ("float32", "bfloat16")]
    for r in rows:
        print(f"{r['dtype']}: {AT_ONCE} x {TOKENS} tokens at once {r['rounds_s']} s; "
              f"one at a time {r['sequential_s_per_request']} s/request", flush=True)  # fmt: skip
    if args.json:
        print(json.dumps({"bench": "vllm_dtype", "rows": rows}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
