"""Record the lab's pairs through real vLLM and the gateway, as production would.

    python bench/lab_pairs_vllm.py [--variants int8,int4-g64,int4-g64-gptq,int3-g64,int2-g64]
        [--out src/quantdrift/data/lab_pairs_vllm.jsonl.gz] [--prompts 40] [--noise 80]

The reference (``ref-f32``, bf16 on vLLM) stays up; each candidate variant gets its
own engine (``quantdrift lab vllm``), one at a time, since two cores are shared.
Every request goes through ``quantdrift gateway``'s own code (a ``Gateway`` on
uvicorn in this process) with the ``openai`` SDK, on a route with
``teacher_forced: true`` whose reference pool says ``teacher_forcing: vllm``, and
every request is shadowed. So each pair is what a gateway in front of vLLM
publishes: the candidate's and the reference's answers with vLLM's top-5
log-probs, the reference's log-probs of the candidate's tokens from vLLM's
``prompt_logprobs``, and each side's engine identity.

The pairs are captured as the bytes the publisher would send to the broker; the
broker is not part of what is recorded. What the recorder adds is what only the
lab knows, the same fields ``quantdrift lab generate`` writes: the prompt's task
and JSON contract (the lab prompts ask for JSON in words, without
``response_format``, so that vLLM's guided decoding does not mask a broken
variant), the variant's label and a deterministic ``pair_id``.

The protocol is the lab's (``lab/generate.py``): the same 40 prompts, greedy and
sampled (T 0.7, top-p 0.9), 48 new tokens, one seed per prompt shared by the
candidate and the reference (the gateway mirrors the request, seed included).
Noise pairs are the reference against itself, sampled without a seed (vLLM draws
one per request, so the two answers are independent samples).

The gateway's degeneration guard is off here: it would replace a looping
candidate's answer by the reference's for the user, and the recorder wants the
candidate's own answers (the pair carries them either way).
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import re
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gateway_serving import quiet_logs, serving

from quantdrift.config import KafkaSettings
from quantdrift.data.prompts import PROMPTS, Prompt
from quantdrift.gateway.gateway_config import parse_config
from quantdrift.gateway.http.service import Gateway
from quantdrift.gateway.shadow.pairs import prompt_text
from quantdrift.gateway.shadow.publisher import PairItem, ShadowPublisher
from quantdrift.lab.generate import TEMPERATURE, TOP_P, prompt_seed
from quantdrift.lab.variants import GPTQ_VARIANTS, VARIANTS
from quantdrift.lab.vllm_process import EngineProcess, start_engine, wait_ready
from quantdrift.schemas import PairEvent
from quantdrift.stack import free_port

REFERENCE = "ref-f32"
MAX_TOKENS = 48  # as the transformers lab set (docs/deciding.md)
DEFAULT_VARIANTS = ("int8", "int4-g64", "int4-g64-gptq", "int3-g64", "int2-g64")
READY_TIMEOUT_S = 1500.0


def label_of(variant: str) -> str:
    """The eval label: the RTN family (``int4``), and ``int4-gptq`` for the real
    W4A16 checkpoint, so the two int4 builds get their own rows."""
    if variant in GPTQ_VARIANTS:
        return f"int{GPTQ_VARIANTS[variant].bits}-gptq"
    return VARIANTS[variant].family


class CapturePublisher(ShadowPublisher):
    """The gateway's publisher, keeping each pair as the bytes it would send."""

    def __init__(self) -> None:
        super().__init__(KafkaSettings(bootstrap_servers=f"127.0.0.1:{free_port()}"), 1.0)
        self.pairs: list[PairEvent] = []

    def offer(self, item: PairItem) -> bool:
        _, value = self._encode_pair(item)
        self.pairs.append(PairEvent.parse(json.loads(value)))
        return True

    async def start(self) -> None:  # no broker in this path
        return None

    async def stop(self, timeout: float = 5.0) -> None:
        return None


def gateway_config(candidate: EngineProcess, reference: EngineProcess, route: str) -> Any:
    return parse_config(
        {
            "precisions": {"cand": [candidate.url], "bf16": [reference.url]},
            "precision_models": {"cand": candidate.variant, "bf16": reference.variant},
            "pools": {"bf16": {"teacher_forcing": "vllm"}},
            # clear_prompts: the lab's prompts are public, and the eval splits by prompt.
            "routes": {
                route: {
                    "candidate": "cand",
                    "reference": "bf16",
                    "teacher_forced": True,
                    "clear_prompts": True,
                }
            },
            "default_route": route,
            "shadow_sample_rate": 1.0,
            "noise_sample_rate": 0.0,
            "degeneration": {"enabled": False},
            "shadow_concurrency": 8,
            "shadow_queue": 1024,
            "timeouts": {"connect_s": 5, "read_s": 300, "total_s": 600, "shadow_total_s": 600},
        }
    )


async def ask_all(
    url: str, route: str, jobs: Sequence[tuple[Prompt, str, int | None]], concurrency: int
) -> None:
    """Every (prompt, decoding, seed) through the gateway with the openai SDK."""
    import openai

    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", timeout=600)
    gate = asyncio.Semaphore(concurrency)

    async def one(prompt: Prompt, decoding: str, seed: int | None) -> None:
        extra: dict[str, Any] = {} if seed is None else {"seed": seed}
        sampled = decoding == "sampled"
        async with gate:
            await client.chat.completions.create(
                model=route,
                messages=[{"role": "user", "content": prompt.text}],
                max_tokens=MAX_TOKENS,
                temperature=TEMPERATURE if sampled else 0.0,
                top_p=TOP_P if sampled else 1.0,
                **extra,
            )

    await asyncio.gather(*(one(p, d, s) for p, d, s in jobs))
    await client.close()


async def record(
    candidate: EngineProcess,
    reference: EngineProcess,
    route: str,
    jobs: Sequence[tuple[Prompt, str, int | None]],
    concurrency: int,
) -> list[PairEvent]:
    publisher = CapturePublisher()
    gateway = Gateway(gateway_config(candidate, reference, route), publisher=publisher)
    async with serving(gateway) as url:
        await ask_all(url, route, jobs, concurrency)
        await gateway.wait_shadows(1200)
    return publisher.pairs


def relabel(
    pair: PairEvent, kind: str, name: str, label: str, index: dict[str, int], round_: int
) -> PairEvent:
    """Add what only the lab knows: the prompt's task and contract, label, pair id.

    The gateway writes the chat as ``role: content`` lines (``shadow_pairs.prompt_text``);
    the lab's pairs carry the user message itself, which is what the eval's prompt
    split (``data/prompts.part_of``) is keyed by, so the prompt is the lab's text."""
    i = index[pair.request.prompt or ""]
    prompt = PROMPTS[i]
    decoding = "sampled" if (pair.request.temperature or 0) > 0 else "greedy"
    tail = f"-r{round_}" if kind == "noise" else f"-s{prompt_seed(0, i)}"
    request = pair.request.model_copy(
        update={
            "prompt": prompt.text,
            "expects_json": prompt.expects_json,
            "expected_keys": list(prompt.expected_keys) if prompt.expected_keys else None,
            "task": prompt.task,
        }
    )
    return pair.model_copy(
        update={
            "pair_id": f"vllm-{kind}-{name}-p{i:02d}-{decoding}{tail}",
            "route": f"lab/{name}",
            "kind": kind,
            "label": label,
            "request": request,
        }
    )


def quantization_of(engine: EngineProcess) -> str | None:
    """How vLLM reported the checkpoint's quantization (its startup log's config line)."""
    found = re.findall(r"quantization=([A-Za-z0-9_-]+)", engine.tail(2_000_000))
    return found[0] if found else None


def missing_tf(pairs: Sequence[PairEvent]) -> int:
    return sum(1 for p in pairs if p.reference_logprobs_on_candidate is None)


def keep_raw(folder: Path | None, name: str, pairs: list[PairEvent]) -> None:
    if folder is not None:
        folder.mkdir(parents=True, exist_ok=True)
        save(folder / f"{name}.jsonl.gz", pairs)


def save(path: Path, pairs: list[PairEvent]) -> None:
    """The pairs as gzipped PairEvent JSONL, sorted by pair id (re-runs diff cleanly)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt", encoding="utf-8", compresslevel=9) as sink:
        for p in sorted(pairs, key=lambda p: p.pair_id):
            sink.write(p.model_dump_json(exclude_none=True) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", default=",".join(DEFAULT_VARIANTS))
    parser.add_argument(
        "--out", type=Path, default=Path("src/quantdrift/data/lab_pairs_vllm.jsonl.gz")
    )
    parser.add_argument("--prompts", type=int, default=len(PROMPTS))
    parser.add_argument("--noise", type=int, default=80, help="reference-vs-reference pairs")
    parser.add_argument("--concurrency", type=int, default=12)
    parser.add_argument(
        "--raw", type=Path, default=None, help="also keep the pairs as captured, per route"
    )
    args = parser.parse_args()
    variants = [v for v in args.variants.split(",") if v]
    unknown = [v for v in variants if v not in VARIANTS and v not in GPTQ_VARIANTS]
    if unknown:
        sys.exit(f"unknown variants: {', '.join(unknown)}")
    if not 1 <= args.prompts <= len(PROMPTS):
        sys.exit(f"--prompts must be in 1..{len(PROMPTS)}")
    quiet_logs()
    prompts = list(PROMPTS[: args.prompts])
    index = {prompt_text([{"role": "user", "content": p.text}]): i for i, p in enumerate(PROMPTS)}
    jobs = [(p, d, prompt_seed(0, i)) for i, p in enumerate(prompts) for d in ("greedy", "sampled")]
    out: list[PairEvent] = []
    stats: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="qd-lab-vllm-") as tmp:
        folder = Path(tmp)
        ref = start_engine(REFERENCE, free_port(), folder, READY_TIMEOUT_S)
        try:
            for n, name in enumerate(variants):
                cand = start_engine(name, free_port(), folder, READY_TIMEOUT_S)
                try:
                    wait_ready([cand, ref] if n == 0 else [cand], READY_TIMEOUT_S + 60)
                    t0 = time.perf_counter()
                    got = asyncio.run(record(cand, ref, f"lab/{name}", jobs, args.concurrency))
                    secs = time.perf_counter() - t0
                finally:
                    cand.stop()
                keep_raw(args.raw, name, got)
                pairs = [relabel(p, "shadow", name, label_of(name), index, 0) for p in got]
                stats[name] = {
                    "pairs": len(pairs),
                    "without_tf": missing_tf(pairs),
                    "seconds": round(secs, 1),
                    "quantization": quantization_of(cand),
                    "startup_s": (cand.ready or {}).get("startup_s"),
                }
                print(f"lab-vllm: {name}: {json.dumps(stats[name])}", file=sys.stderr, flush=True)
                out.extend(pairs)
                save(args.out, out)  # a later failure keeps the variants recorded so far
            if args.noise:
                rounds = -(-args.noise // len(prompts))
                for r in range(rounds):
                    take = prompts[: args.noise - r * len(prompts)]
                    noise_jobs = [(p, "sampled", None) for p in take]
                    if ref.ready is None:  # no candidate ran before the noise
                        wait_ready([ref], READY_TIMEOUT_S + 60)
                    got = asyncio.run(record(ref, ref, "lab/noise", noise_jobs, args.concurrency))
                    keep_raw(args.raw, f"noise-{r + 1}", got)
                    pairs = [relabel(p, "noise", "ref", "noise", index, r + 1) for p in got]
                    stats[f"noise/round{r + 1}"] = {
                        "pairs": len(pairs),
                        "without_tf": missing_tf(pairs),
                    }
                    out.extend(pairs)
        finally:
            ref.stop()
    save(args.out, out)
    print(json.dumps({"bench": "lab_pairs_vllm", "out": str(args.out), "variants": stats}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
