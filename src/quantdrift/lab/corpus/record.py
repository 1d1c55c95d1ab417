"""Record the corpus on real engines, resumably: one reference answer, several candidates.

For every prompt the recorder asks, over the gateway's own upstream code
(``gateway.upstream.pools.Upstreams``: streamed chat, top-5 log-probs, the same payload
shaping, ``teacher_forcing: vllm`` on the reference pool):

* the reference twice, independently (``kind = noise``: the floor measured on the same
  prompts). A greedy prompt's runs are both greedy, as the gateway's noise pairs are;
* every candidate once, and the reference's teacher-forced log-probs of each candidate
  answer (``kind = shadow``), by the answer's own token ids (``return_token_ids``).

No request carries a ``seed``: most real traffic does not, so the candidate's and the
reference's samples are independent, as the noise pair's two samples are (a shared seed
would couple a shadow pair's samples and not the floor's). It also keeps vLLM 0.32's
CPU build alive: a seeded request whose prefill is chunked (a long prompt) kills its
engine core ("CPU Generator does not use offset").

So one reference answer serves every candidate, as a multi-candidate route would use it.
Each pair carries the engine identity of both sides, the prompt's tags
(``PairEvent.tags``), its task, its JSON contract and a deterministic ``pair_id``
(``{prompt}-{variant}``).

**Resume.** Prompts are recorded in blocks (``--block`` prompts each); a block is
written to ``block-NNNNN.jsonl.xz`` under the output folder by an atomic rename when
every pair of it is in. A recording killed mid-block loses that block's work and
nothing else; the next run skips the blocks on disk, so no pair is missing or twice.
A block whose request failed is not written (the run stops with the error): it is
redone on the next run.
"""

from __future__ import annotations

import asyncio
import json
import lzma
import os
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from quantdrift.errors import UpstreamError
from quantdrift.gateway.chain.planning import JsonSpec
from quantdrift.gateway.chain.slices import request_tags
from quantdrift.gateway.gateway_config import GatewayConfig, parse_config
from quantdrift.gateway.openai_wire import Accumulator, Completion
from quantdrift.gateway.shadow.pairs import request_info
from quantdrift.gateway.upstream.pools import Upstreams
from quantdrift.gateway.upstream.teacher_forcing import Scored
from quantdrift.lab.corpus.families import CorpusPrompt
from quantdrift.schemas import PairEvent
from quantdrift.schemas.pair import EngineInfo, ModelOutput

REFERENCE = "ref"
TOP_LOGPROBS = 5
BLOCK_PREFIX = "block-"
BLOCK_SUFFIX = ".jsonl.xz"
RETRIES = 3


@dataclass
class EngineMeter:
    """Tokens an engine read and wrote, and the requests it served."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    requests: int = 0
    tf_requests: int = 0
    retries: int = 0
    # Why a forced scoring gave nothing, by reason (the pair then goes without tf_kl):
    # shown in the progress lines, so a recording that loses its teacher forcing says why.
    tf_failed: Counter[str] = field(default_factory=Counter)

    def add(self, c: Completion) -> None:
        self.requests += 1
        usage = c.usage or {}
        self.prompt_tokens += int(usage.get("prompt_tokens") or 0)
        self.completion_tokens += c.completion_tokens


@dataclass
class Progress:
    blocks_done: int = 0
    prompts_done: int = 0
    pairs: int = 0
    without_tf: int = 0
    seconds: float = 0.0
    meters: dict[str, EngineMeter] = field(default_factory=dict)

    def rates(self) -> dict[str, dict[str, Any]]:
        s = max(self.seconds, 1e-9)
        return {
            name: {
                "prompt_tok_s": round(m.prompt_tokens / s, 1),
                "gen_tok_s": round(m.completion_tokens / s, 1),
                "requests": m.requests,
                "retries": m.retries,
                **({"tf_failed": dict(m.tf_failed)} if m.tf_failed else {}),
            }
            for name, m in self.meters.items()
        }


def recorder_config(
    urls: Mapping[str, str], models: Mapping[str, str], teacher_forcing: str = "vllm"
) -> GatewayConfig:
    """A gateway config whose pools are the engines: the recorder reuses its upstream code.
    ``teacher_forcing`` is the reference pool's (``vllm``; ``lab`` for ``lab serve``)."""
    return parse_config(
        {
            "precisions": {name: [url] for name, url in urls.items()},
            "precision_models": dict(models),
            "pools": {REFERENCE: {"teacher_forcing": teacher_forcing}},
            "routes": {"corpus": {"candidate": REFERENCE, "reference": REFERENCE}},
            "default_route": "corpus",
            "shadow_max_connections": 16,
            "timeouts": {"connect_s": 10, "read_s": 900, "total_s": 1800, "shadow_total_s": 1800},
        }
    )


def block_path(folder: Path, index: int) -> Path:
    return folder / f"{BLOCK_PREFIX}{index:05d}{BLOCK_SUFFIX}"


def done_blocks(folder: Path) -> set[int]:
    """Blocks already on disk (complete by construction: written by rename)."""
    out = set()
    for p in folder.glob(f"{BLOCK_PREFIX}*{BLOCK_SUFFIX}"):
        stem = p.name[len(BLOCK_PREFIX) : -len(BLOCK_SUFFIX)]
        if stem.isdigit():
            out.add(int(stem))
    return out


def write_block(folder: Path, index: int, pairs: Sequence[PairEvent]) -> Path:
    """Write a block atomically (tmp file, fsync, rename). xz, not gzip: the corpus is
    committed, and its per-token log-probs take 38 % less room (25 prompts: 308 KB
    against 496 KB), which keeps 3,200 prompts near 40 MB."""
    folder.mkdir(parents=True, exist_ok=True)
    final = block_path(folder, index)
    tmp = final.with_name(final.name + ".tmp")
    with lzma.open(tmp, "wt", encoding="utf-8", preset=9 | lzma.PRESET_EXTREME) as sink:
        for p in pairs:
            sink.write(p.model_dump_json(exclude_none=True) + "\n")
    with open(tmp, "rb") as fh:
        os.fsync(fh.fileno())
    os.replace(tmp, final)
    return final


class CorpusRecorder:
    """Asks the engines for one block of prompts at a time and builds its pairs."""

    def __init__(
        self,
        urls: Mapping[str, str],
        models: Mapping[str, str],
        candidates: Sequence[str],
        *,
        concurrency: int = 12,
        teacher_forcing: str = "vllm",
        clock: Callable[[], float] = time.time,
    ) -> None:
        if REFERENCE not in urls:
            raise ValueError(f"the engines must include the reference, {REFERENCE!r}")
        self.config = recorder_config(urls, models, teacher_forcing)
        self.candidates = list(candidates)
        self.concurrency = concurrency
        self.clock = clock
        self.upstreams: Upstreams | None = None
        self.identities: dict[str, EngineInfo] = {}
        self.meters: dict[str, EngineMeter] = {n: EngineMeter() for n in urls}

    async def __aenter__(self) -> CorpusRecorder:
        self.upstreams = Upstreams(self.config, shadow=True)
        for name in self.config.precisions:
            pool = self.upstreams[name]
            self.identities[name] = await pool.identify()
            # An engine given by URL serves under its own name: ask for that model.
            pool.model = pool.model or self.identities[name].model
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.upstreams is not None:
            await self.upstreams.aclose()

    def _body(self, p: CorpusPrompt) -> dict[str, Any]:
        return {
            "messages": p.messages,
            "max_tokens": p.max_tokens,
            "temperature": p.temperature,
            "top_p": p.top_p,
            "logprobs": True,
            "top_logprobs": TOP_LOGPROBS,
            # The answer's own token ids: teacher forcing scores them, not a re-tokenized text
            # (which split about one cut answer in six differently).
            "return_token_ids": True,
        }

    async def _ask(self, name: str, body: Mapping[str, Any]) -> Completion:
        """One answer; a dropped connection is retried (uvicorn closes idle keep-alive
        connections, and a request can race that close), an engine that keeps failing
        ends the run: its block is redone by the next one."""
        assert self.upstreams is not None
        for attempt in range(RETRIES + 1):
            acc = Accumulator(name)
            try:
                async for chunk in self.upstreams[name].stream(body):
                    acc.add(chunk)
            except UpstreamError:
                if attempt == RETRIES:
                    raise
                self.meters[name].retries += 1
                await asyncio.sleep(0.5 * (attempt + 1))
                continue
            break
        done = acc.finish().stripped(TOP_LOGPROBS)
        self.meters[name].add(done)
        return done

    def _side(self, c: Completion) -> ModelOutput:
        out = c.output(TOP_LOGPROBS)
        info = self.identities.get(c.precision, EngineInfo())
        info = info.model_copy(update={"system_fingerprint": c.system_fingerprint})
        return out if info == EngineInfo() else out.model_copy(update={"engine": info})

    def _pair(
        self,
        p: CorpusPrompt,
        kind: str,
        label: str,
        cand: Completion,
        ref: Completion,
        tf: list[float] | None,
    ) -> PairEvent:
        body = self._body(p)
        spec = JsonSpec(p.json_schema, p.expected_keys) if p.output_kind == "json" else None
        checkable = p.checkable()
        request = request_info(
            body, spec, clear=True, private=False, preference=None, salt=""
        ).model_copy(
            update={
                "task": p.family,
                "expected_answer": None if checkable is None else checkable[0],
                "answer_kind": None if checkable is None else checkable[1],
            }
        )
        return PairEvent(
            pair_id=f"{p.prompt_id}-{label}",
            ts=self.clock(),
            route="corpus/" + label,
            kind=kind,  # type: ignore[arg-type]
            candidate=self._side(cand),
            reference=self._side(ref),
            request=request,
            reference_logprobs_on_candidate=tf,
            # The gateway's tags, and the lab's own where it knows better: the task family
            # and the length the model's tokenizer measured.
            tags=request_tags(body, expects_json=spec is not None, given=p.tags()),
            label=label,
        )

    async def _prompt(self, p: CorpusPrompt, gate: asyncio.Semaphore) -> list[PairEvent]:
        assert self.upstreams is not None
        async with gate:
            first, second = await asyncio.gather(
                self._ask(REFERENCE, self._body(p)), self._ask(REFERENCE, self._body(p))
            )
        pairs = [self._pair(p, "noise", "noise", first, second, None)]

        async def one(name: str) -> PairEvent:
            async with gate:
                cand = await self._ask(name, self._body(p))
                tf = None
                if cand.text:
                    assert self.upstreams is not None
                    outcome = await self.upstreams[REFERENCE].score(p.messages, cand, timeout_s=900)
                    self.meters[REFERENCE].tf_requests += 1
                    if isinstance(outcome, Scored):
                        tf = outcome.logprobs
                    else:
                        self.meters[REFERENCE].tf_failed[
                            f"{outcome.reason}: {outcome.detail[:120]}"
                        ] += 1
            return self._pair(p, "shadow", name, cand, first, tf)

        pairs.extend(await asyncio.gather(*(one(n) for n in self.candidates)))
        return pairs

    async def block(self, prompts: Sequence[CorpusPrompt]) -> list[PairEvent]:
        """Every prompt's pairs, or the first error with the rest cancelled (a task
        group: no request of a failed block outlives it)."""
        gate = asyncio.Semaphore(self.concurrency)
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(self._prompt(p, gate)) for p in prompts]
        return [pair for t in tasks for pair in t.result()]


async def record(
    prompts: Sequence[CorpusPrompt],
    folder: Path,
    urls: Mapping[str, str],
    models: Mapping[str, str],
    candidates: Sequence[str],
    *,
    block: int = 25,
    concurrency: int = 12,
    deadline: float | None = None,
    teacher_forcing: str = "vllm",
    on_block: Callable[[Progress, dict[str, Any]], None] | None = None,
) -> Progress:
    """Record every block not yet on disk, in order, until done or past ``deadline``
    (a ``time.monotonic()`` value: the current block finishes, no new one starts)."""
    have = done_blocks(folder)
    progress = Progress(blocks_done=len(have))
    t0 = time.monotonic()
    async with CorpusRecorder(
        urls, models, candidates, concurrency=concurrency, teacher_forcing=teacher_forcing
    ) as rec:
        progress.meters = rec.meters
        for index in range(0, -(-len(prompts) // block)):
            if index in have:
                continue
            if deadline is not None and time.monotonic() >= deadline:
                break
            chunk = prompts[index * block : (index + 1) * block]
            t_block = time.monotonic()
            pairs = await rec.block(chunk)
            path = write_block(folder, index, pairs)
            progress.blocks_done += 1
            progress.prompts_done += len(chunk)
            progress.pairs += len(pairs)
            progress.without_tf += sum(
                1 for x in pairs if x.kind == "shadow" and x.reference_logprobs_on_candidate is None
            )
            progress.seconds = time.monotonic() - t0
            if on_block is not None:
                on_block(
                    progress,
                    {
                        "block": index,
                        "file": path.name,
                        "prompts": len(chunk),
                        "block_s": round(time.monotonic() - t_block, 1),
                    },
                )
    progress.seconds = time.monotonic() - t0
    return progress


def progress_line(progress: Progress, info: Mapping[str, Any], total_blocks: int) -> str:
    return json.dumps(
        {
            **info,
            "blocks": f"{progress.blocks_done}/{total_blocks}",
            "pairs": progress.pairs,
            "without_tf": progress.without_tf,
            "engines": progress.rates(),
        }
    )
