"""Decoding with per-token data, teacher-forced scoring, and the lab run that writes pairs.

One hand-written decode loop (KV cache, left-padded batches) instead of
``model.generate`` so every step yields what the detectors need: the chosen
token's log-prob, the entropy of the full softmax (nats), and the top-k
alternatives. All of these come from the model's *raw* distribution
(temperature 1, no top-p), as OpenAI / vLLM report log-probs; temperature and
top-p only shape the sampling.

Sampling is seeded per prompt with its own ``torch.Generator`` (the same
stream ``torch.manual_seed(seed)`` would give), so a row's draws do not
depend on which other prompts share its batch, and the candidate and the
reference see the same random numbers for the same (prompt, seed).
"""

from __future__ import annotations

import copy
import gzip
import hashlib
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, TextIO

import torch

from quantdrift.data.prompts import PROMPTS, Prompt
from quantdrift.lab.model import MODEL_NAME, REFERENCE_PRECISION
from quantdrift.lab.quant import quantize_model, variant
from quantdrift.schemas import PairEvent
from quantdrift.schemas.pair import ModelOutput, RequestInfo

TEMPERATURE = 0.7
TOP_P = 0.9
TOP_K_LOGPROBS = 5
DECODINGS = ("greedy", "sampled")


@dataclass(slots=True)
class Step:
    """One generated token and what the model thought of it."""

    token_id: int
    token: str
    logprob: float
    entropy: float
    top: dict[str, float]


@dataclass(slots=True)
class Generation:
    prompt_ids: list[int]
    steps: list[Step] = field(default_factory=list)
    text: str = ""
    finish_reason: str = "length"
    latency_ms: float = 0.0

    @property
    def token_ids(self) -> list[int]:
        return [s.token_id for s in self.steps]


def encode_chat(tokenizer: Any, messages: str | list[dict[str, str]]) -> list[int]:
    """Token ids of a chat (or one user message) with the model's template and a generation cue."""
    if isinstance(messages, str):
        messages = [{"role": "user", "content": messages}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def stop_ids(tokenizer: Any) -> set[int]:
    """<|im_end|> ends a turn; the GGUF's eos metadata is unreliable, so take both."""
    ids = {tid for tid in (tokenizer.eos_token_id,) if tid is not None}
    for name in ("<|im_end|>", "<|endoftext|>"):
        tid = tokenizer.convert_tokens_to_ids(name)
        if isinstance(tid, int) and tid != tokenizer.unk_token_id:
            ids.add(tid)
    return ids


def _sample(logits: torch.Tensor, temperature: float, top_p: float, gen: torch.Generator) -> int:
    probs = torch.softmax(logits / temperature, dim=-1)
    sorted_p, order = probs.sort(descending=True)
    keep = (sorted_p.cumsum(-1) - sorted_p) < top_p  # the nucleus, always >= 1 token
    sorted_p = torch.where(keep, sorted_p, torch.zeros_like(sorted_p))
    pick = torch.multinomial(sorted_p / sorted_p.sum(), 1, generator=gen)
    return int(order[pick])


@torch.inference_mode()
def generate(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[list[int]],
    *,
    max_new_tokens: int,
    temperature: float = 0.0,
    top_p: float = 1.0,
    seeds: Sequence[int] | None = None,
    top_k: int = TOP_K_LOGPROBS,
    on_step: Callable[[int, Step], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> list[Generation]:
    """Decode a left-padded batch; greedy when ``temperature`` is 0."""
    batch = len(prompts)
    sampled = temperature > 0
    if sampled and (seeds is None or len(seeds) != batch):
        raise ValueError("sampled decoding needs one seed per prompt")
    gens = [torch.Generator().manual_seed(int(s)) for s in seeds] if sampled and seeds else []
    stops = stop_ids(tokenizer)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(stops)
    width = max(len(p) for p in prompts)
    ids = torch.full((batch, width), pad, dtype=torch.long)
    mask = torch.zeros((batch, width), dtype=torch.long)
    for b, p in enumerate(prompts):
        ids[b, width - len(p) :] = torch.tensor(p)
        mask[b, width - len(p) :] = 1
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    out = [Generation(prompt_ids=list(p)) for p in prompts]
    done = [False] * batch
    past = None
    start = time.perf_counter()
    for _ in range(max_new_tokens):
        if should_stop is not None and should_stop():
            break
        result = model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            past_key_values=past,
            use_cache=True,
        )
        past = result.past_key_values
        logits = result.logits[:, -1, :].float()
        logp = torch.log_softmax(logits, dim=-1)
        entropy = -(logp.exp() * logp).sum(-1)
        top_vals, top_ids = logp.topk(top_k, dim=-1)
        chosen = []
        for b in range(batch):
            if done[b]:
                chosen.append(pad)
                continue
            tid = (
                _sample(logits[b], temperature, top_p, gens[b])
                if sampled
                else int(logits[b].argmax())
            )
            chosen.append(tid)
            if tid in stops:
                done[b] = True
                out[b].finish_reason = "stop"
                out[b].latency_ms = (time.perf_counter() - start) * 1000
                continue
            step = Step(
                token_id=tid,
                token=tokenizer.decode([tid]),
                logprob=float(logp[b, tid]),
                entropy=max(0.0, float(entropy[b])),
                top={
                    tokenizer.decode([int(t)]): float(v)
                    for t, v in zip(top_ids[b].tolist(), top_vals[b].tolist(), strict=True)
                },
            )
            out[b].steps.append(step)
            if on_step is not None:
                on_step(b, step)
        if all(done):
            break
        ids = torch.tensor(chosen, dtype=torch.long).unsqueeze(1)
        mask = torch.cat([mask, torch.ones((batch, 1), dtype=torch.long)], dim=1)
        positions = positions[:, -1:] + 1
    elapsed = (time.perf_counter() - start) * 1000
    for b, g in enumerate(out):
        if not done[b]:
            g.latency_ms = elapsed
        g.text = tokenizer.decode(g.token_ids, skip_special_tokens=True)
    return out


@torch.inference_mode()
def score_continuations(
    model: Any, prompts: Sequence[list[int]], continuations: Sequence[list[int]], pad: int = 0
) -> list[list[float]]:
    """Teacher forcing: one prefill per row over prompt + continuation (right-padded batch);
    the model's log-prob of each continuation token given everything before it."""
    return [s.logprobs for s in forced_views(model, prompts, continuations, pad)]


@dataclass(frozen=True, slots=True)
class ForcedView:
    """One forced continuation: the model's log-prob of each token, its rank (1-based,
    among the whole vocabulary) and the model's own ``top_k`` ids with log-probs there."""

    logprobs: list[float]
    ranks: list[int]
    top: list[list[tuple[int, float]]]


@torch.inference_mode()
def forced_views(
    model: Any,
    prompts: Sequence[list[int]],
    continuations: Sequence[list[int]],
    pad: int = 0,
    top_k: int = 0,
) -> list[ForcedView]:
    """:func:`score_continuations` with each token's rank and the model's top-``top_k``."""
    rows = [list(p) + list(c) for p, c in zip(prompts, continuations, strict=True)]
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for b, r in enumerate(rows):
        ids[b, : len(r)] = torch.tensor(r)
        mask[b, : len(r)] = 1
    logp = torch.log_softmax(model(input_ids=ids, attention_mask=mask).logits.float(), dim=-1)
    out: list[ForcedView] = []
    for b, (p, c) in enumerate(zip(prompts, continuations, strict=True)):
        if not c:
            out.append(ForcedView([], [], []))
            continue
        pos = torch.arange(len(p) - 1, len(p) - 1 + len(c))
        rows_lp = logp[b, pos]  # (len(c), vocab)
        mine = rows_lp[torch.arange(len(c)), torch.tensor(c)]
        ranks = (rows_lp > mine[:, None]).sum(dim=-1) + 1
        top: list[list[tuple[int, float]]] = [[] for _ in c]
        if top_k > 0:
            values, where = torch.topk(rows_lp, k=top_k, dim=-1)
            top = [
                list(zip(w.tolist(), v.tolist(), strict=True))
                for w, v in zip(where, values, strict=True)
            ]
        out.append(ForcedView(mine.tolist(), ranks.tolist(), top))
    return out


# --- the lab run ---------------------------------------------------------------------------


def _r(x: float) -> float:
    return round(float(x), 4)


def _output(g: Generation, precision: str) -> ModelOutput:
    return ModelOutput(
        text=g.text,
        model=MODEL_NAME,
        precision=precision,
        entropy=[_r(s.entropy) for s in g.steps],
        top_logprobs=[{k: _r(v) for k, v in s.top.items()} for s in g.steps],
        token_logprobs=[_r(s.logprob) for s in g.steps],
        tokens=[s.token for s in g.steps],
        latency_ms=_r(g.latency_ms),
        finish_reason=g.finish_reason,
    )


def _request(prompt: Prompt, decoding: str, max_new_tokens: int) -> RequestInfo:
    sampled = decoding == "sampled"
    return RequestInfo(
        prompt=prompt.text,
        prompt_hash=hashlib.sha256(prompt.text.encode()).hexdigest()[:32],
        expects_json=prompt.expects_json,
        expected_keys=list(prompt.expected_keys) if prompt.expected_keys else None,
        temperature=TEMPERATURE if sampled else 0.0,
        top_p=TOP_P if sampled else 1.0,
        max_tokens=max_new_tokens,
        task=prompt.task,
    )


def pair_id(
    kind: str, name: str, index: int, decoding: str, seed: int, seed2: int | None = None
) -> str:
    """Deterministic: the same run writes the same ids, so re-runs dedupe."""
    tail = f"-s{seed2}" if seed2 is not None else ""
    return f"lab-{kind}-{name}-p{index:02d}-{decoding}-s{seed}{tail}"


def prompt_seed(base: int, index: int, round_: int = 0) -> int:
    """The seed of prompt ``index`` in round ``round_``: one per prompt, shared by the
    candidate and the reference (``bench/lab_pairs_vllm.py`` records vLLM pairs with it)."""
    return base + index + 1000 * round_


@dataclass(slots=True)
class LabConfig:
    variants: list[str]
    prompts: int = len(PROMPTS)
    max_new_tokens: int = 80
    decodings: tuple[str, ...] = DECODINGS
    noise_pairs: int = 0
    seed: int = 0
    batch_size: int = 8
    # Skip the first prompts: extend a recorded set with the rest of the prompts, with
    # the same seeds and pair ids a full run would give them (indices stay absolute).
    first_prompt: int = 0


def _batched(
    model: Any,
    tokenizer: Any,
    encoded: list[list[int]],
    decoding: str,
    seeds: list[int],
    cfg: LabConfig,
) -> list[Generation]:
    result: list[Generation | None] = [None] * len(encoded)
    chunks = _length_batches([len(e) for e in encoded], cfg.batch_size)
    for chunk in chunks:
        gens = generate(
            model,
            tokenizer,
            [encoded[i] for i in chunk],
            max_new_tokens=cfg.max_new_tokens,
            temperature=TEMPERATURE if decoding == "sampled" else 0.0,
            top_p=TOP_P if decoding == "sampled" else 1.0,
            seeds=[seeds[i] for i in chunk],
        )
        for i, g in zip(chunk, gens, strict=True):
            result[i] = g
    return [g for g in result if g is not None]


def _length_batches(lengths: Sequence[int], batch_size: int) -> list[list[int]]:
    """Indices grouped by length: a new batch when full, or when padding would exceed half
    the row (long-context rows padded next to short ones waste most of a CPU prefill)."""
    chunks: list[list[int]] = []
    for i in sorted(range(len(lengths)), key=lambda i: lengths[i]):
        if not chunks or len(chunks[-1]) >= batch_size or lengths[i] > 1.5 * lengths[chunks[-1][0]]:
            chunks.append([])
        chunks[-1].append(i)
    return chunks


def _cross_score(
    reference: Any, encoded: list[list[int]], gens: list[Generation], batch_size: int
) -> list[list[float]]:
    out: list[list[float]] = [[] for _ in gens]
    lengths = [len(p) + len(g.steps) for p, g in zip(encoded, gens, strict=True)]
    for chunk in _length_batches(lengths, batch_size):
        scores = score_continuations(
            reference, [encoded[i] for i in chunk], [gens[i].token_ids for i in chunk]
        )
        for i, sc in zip(chunk, scores, strict=True):
            out[i] = sc
    return out


def run_lab(
    model: Any, tokenizer: Any, cfg: LabConfig, sink: TextIO, log: TextIO = sys.stderr
) -> dict[str, Any]:
    """Generate reference, candidate and noise outputs and write PairEvent JSONL to ``sink``.

    ``model`` is the float reference and is left untouched (candidates are deep copies).
    Returns timings: tokens/s per model run and pairs written.
    """
    specs = [variant(v) for v in cfg.variants]
    first = cfg.first_prompt
    prompts = list(PROMPTS[first : cfg.prompts])
    encoded = [encode_chat(tokenizer, p.text) for p in prompts]
    seeds = [prompt_seed(cfg.seed, first + i) for i in range(len(prompts))]
    stats: dict[str, Any] = {"tokens_per_s": {}, "pairs": {}}

    def timed(name: str, fn: Callable[[], list[Generation]]) -> list[Generation]:
        t0 = time.perf_counter()
        gens = fn()
        secs = time.perf_counter() - t0
        tokens = sum(len(g.steps) for g in gens)
        stats["tokens_per_s"][name] = round(tokens / secs, 1) if secs else 0.0
        log.write(
            f"lab: {name}: {len(gens)} generations, {tokens} tokens, {secs:.1f}s "
            f"({tokens / secs:.1f} tok/s)\n"
        )
        log.flush()
        return gens

    def write(events: Iterable[PairEvent], label: str) -> None:
        n = 0
        for ev in events:
            sink.write(ev.model_dump_json(exclude_none=True) + "\n")
            n += 1
        sink.flush()
        stats["pairs"][label] = stats["pairs"].get(label, 0) + n

    ref_gens = {
        d: timed(f"reference/{d}", partial(_batched, model, tokenizer, encoded, d, seeds, cfg))
        for d in cfg.decodings
    }
    # Noise first (it needs only the reference), so a run cut short still has a noise floor.
    # Noise: the reference's sampled output against another sampled reference run with a
    # different seed, cycling through the prompts (round r uses seed + 1000 * (r + 1)).
    if cfg.noise_pairs:
        base = ref_gens.get("sampled") or timed(
            "reference/sampled", lambda: _batched(model, tokenizer, encoded, "sampled", seeds, cfg)
        )
        rounds = -(-cfg.noise_pairs // len(prompts))
        for r in range(rounds):
            idx = list(range(len(prompts)))[: cfg.noise_pairs - r * len(prompts)]
            seeds2 = [prompt_seed(cfg.seed, first + i, r + 1) for i in range(len(prompts))]
            sub = [encoded[i] for i in idx]
            gens = timed(
                f"noise/round{r + 1}",
                partial(_batched, model, tokenizer, sub, "sampled", [seeds2[i] for i in idx], cfg),
            )
            cross = _cross_score(model, sub, gens, cfg.batch_size)
            write(
                (
                    PairEvent(
                        pair_id=pair_id("noise", "ref", first + i, "sampled", seeds[i], seeds2[i]),
                        ts=time.time(),
                        route="lab/noise",
                        kind="noise",
                        candidate=_output(g, REFERENCE_PRECISION),
                        reference=_output(base[i], REFERENCE_PRECISION),
                        request=_request(prompts[i], "sampled", cfg.max_new_tokens),
                        reference_logprobs_on_candidate=[_r(x) for x in cross[j]],
                        label="noise",
                    )
                    for j, (i, g) in enumerate(zip(idx, gens, strict=True))
                ),
                "noise",
            )
    for spec in specs:
        candidate = copy.deepcopy(model)
        quantize_model(candidate, spec)
        for d in cfg.decodings:
            gens = timed(
                f"{spec.name}/{d}",
                partial(_batched, candidate, tokenizer, encoded, d, seeds, cfg),
            )
            cross = _cross_score(model, encoded, gens, cfg.batch_size)
            write(
                (
                    PairEvent(
                        pair_id=pair_id("shadow", spec.name, first + i, d, seeds[i]),
                        ts=time.time(),
                        route=f"lab/{spec.name}",
                        kind="shadow",
                        candidate=_output(g, spec.name),
                        reference=_output(ref_gens[d][i], REFERENCE_PRECISION),
                        request=_request(prompts[i], d, cfg.max_new_tokens),
                        reference_logprobs_on_candidate=[_r(x) for x in cross[i]],
                        label=spec.family,
                    )
                    for i, g in enumerate(gens)
                ),
                spec.family,
            )
        del candidate

    return stats


def open_sink(path: Path) -> TextIO:
    """Text sink for JSONL; gzip when the name ends in .gz."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".gz":
        return gzip.open(path, "wt", encoding="utf-8", compresslevel=9)
    return open(path, "w", encoding="utf-8")
