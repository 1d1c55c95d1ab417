"""Preflight against real vLLM: the int4 candidate must get no-go, the int8 one go.

    python bench/preflight_vllm.py [--json] [--write docs/vllm-preflight.json]

Starts three engines with ``quantdrift lab vllm`` (from ``.venv-vllm``, built by
``make vllm``): the bf16 reference ``ref-f32``, the int8-class ``int8`` (RTN, bf16
weights) and ``int4-g64-gptq`` (the GPTQ W4A16 checkpoint on vLLM's int4 kernel, where
this CPU has it; else ``int4-g64``, the same weights dequantized), all at once, then
runs ``quantdrift preflight`` for each candidate against the reference with the checks
that talk to a serving engine:

- ``perplexity`` through vLLM's ``prompt_logprobs``;
- ``niah`` at a quarter and a half of the servers' ``max_model_len`` and the
  window less room for the question, read from ``/v1/models`` (no lengths given);
- ``warmup`` on the engines as they come up: the first request of each
  prompt-length bucket is a cold one;
- ``memory-utilization`` from the running server's own command line (the one
  ``quantdrift lab vllm`` ran, recorded in its ready line). This is the CPU build,
  which has no ``--gpu-memory-utilization``, so the check skips and the skip is
  waived by name, as a CPU deployment would;
- ``salient-weights`` on each exported checkpoint folder.

``load`` (1.5x through the gateway) is not run here: it needs the gateway and the
stack in front of the engines for its duration, and the ``tests/vllm`` tier, which
has them up, runs it (``test_vllm_preflight_load.py``).

Prints one line per candidate and verdict; with ``--json`` ends with one JSON
object ``{variant: {"verdict", "items": {id: {"status", "summary"}}}}``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from quantdrift.lab.vllm_process import start_engine, wait_ready
from quantdrift.lab.vllm_server import int4_candidate
from quantdrift.stack import free_port

REFERENCE = "ref-f32"
CANDIDATES = ("int8", int4_candidate())  # GPTQ where vLLM's int4 kernel runs here
CHECKS = "perplexity,niah,warmup,memory-utilization,salient-weights"
READY_TIMEOUT_S = 1500


def preflight(
    folder: Path, variant: str, urls: dict[str, str], ready: dict[str, Any]
) -> dict[str, Any]:
    serving = folder / f"serving-{variant}.txt"
    serving.write_text(" ".join(ready.get("argv") or ["vllm", "serve", variant]) + "\n")
    config = folder / f"preflight-{variant}.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "candidate": {"url": urls[variant], "model": variant},
                "reference": {"url": urls[REFERENCE], "model": REFERENCE},
                "route": f"preflight/{variant}",
                "report": str(folder / f"report-{variant}.json"),
                "vetoes": ["niah", "perplexity"],
                "waivers": {
                    "memory-utilization": "vLLM CPU build: no gpu_memory_utilization to check"
                },
                "salient-weights": {"checkpoint": str(folder / variant)},
                "memory-utilization": {"serving_config": str(serving)},
                # The 135M reference itself misses some needles (docs/preflight.md).
                "niah": {"floor": 0.75, "tolerance": 0.05},
            }
        )
    )
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "quantdrift",
            "preflight",
            "--config",
            str(config),
            "--only",
            CHECKS,
            "--json",
            "--quiet",
        ],
        capture_output=True,
        text=True,
        timeout=3600,
    )
    if proc.returncode not in (0, 1):
        raise SystemExit(f"preflight for {variant} failed ({proc.returncode}): {proc.stderr}")
    report = json.loads(proc.stdout)
    return {
        "verdict": report["verdict"],
        "exit": proc.returncode,
        "items": {
            it["id"]: {
                "status": it["status"],
                "summary": it["evidence"].get("why") or it["evidence"].get("reason") or "",
                "measured": it["measured"],
            }
            for it in report["items"]
        },
        "vetoes": report.get("vetoes", []),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--write", type=Path, help="also write the JSON result here")
    args = ap.parse_args()
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="qd-preflight-vllm-") as tmp:
        folder = Path(tmp)
        engines = [
            start_engine(v, free_port(), folder, READY_TIMEOUT_S) for v in (REFERENCE, *CANDIDATES)
        ]
        try:
            wait_ready(engines, READY_TIMEOUT_S + 60)
            ready = {e.variant: e.ready or {} for e in engines}
            urls = {e.variant: e.url for e in engines}
            results = {v: preflight(folder, v, urls, ready[v]) for v in CANDIDATES}
        finally:
            for e in engines:
                e.stop()
    for v, r in results.items():
        print(f"{v}: {r['verdict']}")
        for item, got in r["items"].items():
            print(f"  {got['status']:8} {item:20} {got['summary']}")
    out = {
        "engines": {
            v: {k: ready[v].get(k) for k in ("version", "startup_s", "max_model_len")}
            for v in ready
        },
        "results": results,
        "wall_s": round(time.monotonic() - t0, 1),
    }
    if args.write:
        args.write.write_text(json.dumps(out, indent=2) + "\n")
    if args.json:
        print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
