"""The checks that talk to the candidate and reference models: warmup, niah, perplexity."""

from __future__ import annotations

import asyncio
import json
import statistics
from typing import Any

from quantdrift.errors import ConfigError
from quantdrift.preflight import niah as niah_mod
from quantdrift.preflight import perplexity as ppl_mod
from quantdrift.preflight.context import Context
from quantdrift.preflight.endpoints import Endpoint, EndpointError
from quantdrift.preflight.report import Item, failed, judged, skipped

NIAH = "niah"
PERPLEXITY = "perplexity"
WARMUP = "warmup"
TITLES = {
    NIAH: "Needle in a haystack: candidate recall against reference",
    PERPLEXITY: "Domain perplexity: candidate against reference (teacher-forced)",
    WARMUP: "Cold start: first request per prompt-length bucket against steady p50",
}


def _endpoint(ctx: Context, side: str) -> Endpoint | None:
    e = getattr(ctx.config, side)
    return None if e is None else Endpoint(e.url, e.model, e.timeout_s, e.api_key)


async def _context_length(ctx: Context, *eps: Endpoint) -> int | None:
    """The smallest context length the endpoints report (both must fit the haystack)."""
    key = "context_length:" + ",".join(sorted(ep.url for ep in eps))
    if key not in ctx.cache:
        found = []
        for ep in eps:
            async with ep.client() as c:
                n = await ep.context_length(c)
            if n:
                found.append(n)
        ctx.cache[key] = min(found) if found else None
    value = ctx.cache[key]
    return value if isinstance(value, int) else None


# -- niah ----------------------------------------------------------------------------


async def _cjk_density(
    ctx: Context, needles: tuple[niah_mod.Needle, ...], eps: tuple[Endpoint, ...]
) -> dict[str, float]:
    """Characters per token for each CJK language, the tighter of the endpoints' counts.

    Each server counts one probe haystack (max_tokens 1); a language no server counted
    is left out and its haystacks use the fallback (``niah.CJK_CHARS_PER_TOKEN``).
    """
    out: dict[str, float] = {}
    for lang in sorted({n.language for n in needles} - {"en"}):
        needle = next(n for n in needles if n.language == lang)
        probe = niah_mod.haystack(niah_mod.PROBE_TOKENS, needle, 0.5, seed=ctx.config.seed)
        counted = []
        for ep in eps:
            async with ep.client() as client:
                reply = await ep.chat(client, probe, 1, seed=ctx.config.seed)
            if reply.prompt_tokens:
                counted.append(niah_mod.chars_per_token(probe, reply.prompt_tokens))
        if counted:
            out[lang] = round(min(counted), 4)
    if out:
        ctx.progress(f"{NIAH}: characters per token {out} (counted by the servers)")
    return out


async def niah(ctx: Context) -> Item:
    cand, ref = _endpoint(ctx, "candidate"), _endpoint(ctx, "reference")
    if cand is None or ref is None:
        return skipped(NIAH, TITLES[NIAH], "needs both --candidate and --reference endpoints")
    c = ctx.config.niah
    context = await _context_length(ctx, cand, ref)
    lengths = tuple(c.lengths) if c.lengths else niah_mod.default_lengths(context)
    needles = (
        tuple(niah_mod.Needle(n.fact, n.question, n.answer, n.language) for n in c.needles)
        if c.needles
        else tuple(n for lang in c.languages for n in niah_mod.NEEDLES[lang])
    )
    try:
        cases = niah_mod.cases_by_language(lengths, c.depths, needles, c.per_cell, c.languages)
    except ValueError as exc:
        raise ConfigError(f"niah: {exc} (niah.needles has none in that language)") from exc
    ctx.progress(
        f"{NIAH}: {len(cases)} cases per side at lengths {list(lengths)} in "
        f"{', '.join(c.languages)} (context {context or 'unknown'})"
    )
    density = await _cjk_density(ctx, needles, (cand, ref))
    done = {"n": 0}

    async def side(ep: Endpoint, name: str) -> list[dict[str, Any]]:
        out = []
        async with ep.client() as client:
            for case in cases:
                prompt = niah_mod.haystack(
                    case.length,
                    case.needle,
                    case.depth,
                    seed=ctx.config.seed + case.seed,
                    chars_per_token=density.get(case.needle.language),
                )
                reply = await ep.chat(client, prompt, c.max_tokens, seed=ctx.config.seed)
                out.append(
                    {
                        "hit": niah_mod.hit(reply.text, case.needle.answer),
                        "text": reply.text[:160],
                        "prompt_tokens": reply.prompt_tokens,
                        "latency_s": round(reply.latency_s, 3),
                    }
                )
                done["n"] += 1
                if done["n"] % 4 == 0:
                    ctx.progress(f"{NIAH}: {done['n']}/{2 * len(cases)} replies")
        return out

    # The two sides are different servers: ask them at the same time.
    cand_rows, ref_rows = await asyncio.gather(side(cand, "candidate"), side(ref, "reference"))
    rows = [
        {
            "language": case.needle.language,
            "length": case.length,
            "depth": case.depth,
            "answer": case.needle.answer,
            "prompt_tokens": cr["prompt_tokens"] or rr["prompt_tokens"],
            "candidate_hit": cr["hit"],
            "reference_hit": rr["hit"],
            "candidate_text": cr["text"],
            "reference_text": rr["text"],
        }
        for case, cr, rr in zip(cases, cand_rows, ref_rows, strict=True)
    ]
    rc, rr_ = niah_mod.recall(rows, "candidate_hit"), niah_mod.recall(rows, "reference_hit")
    ok, why = niah_mod.judge(rc, rr_, c.floor, c.tolerance)
    cells = niah_mod.by_cell(rows)
    # Veto per cell: a language that loses its needles at one length is not averaged away.
    vetoed = niah_mod.judge_cells(cells, c.floor, c.tolerance)
    if vetoed:
        cells_why = f"{len(vetoed)} of {len(cells)} cells below: {'; '.join(vetoed[:4])}"
        why = cells_why if ok else f"{cells_why}; overall {why}"
        ok = False
    return judged(
        NIAH,
        TITLES[NIAH],
        ok,
        {
            "candidate_recall": round(rc, 4),
            "reference_recall": round(rr_, 4),
            "cases": len(rows),
            "lengths": list(lengths),
            "languages": list(c.languages),
            "cells": len(cells),
            "cells_below": len(vetoed),
            "context_length": context,
        },
        {"floor": c.floor, "tolerance": c.tolerance, "per_cell": True},
        why=why,
        by_length=niah_mod.by_length(rows),
        by_cell=cells,
        chars_per_token=density,
        cases=rows,
    )


# -- perplexity ----------------------------------------------------------------------


def load_domain_texts(path: Any) -> list[ppl_mod.DomainText]:
    out = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise ConfigError(f"perplexity texts {path}: {exc.strerror or exc}") from exc
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
            out.append(
                ppl_mod.DomainText(
                    str(rec.get("prompt", "")), str(rec["text"]), str(rec.get("domain", ""))
                )
            )
        except (ValueError, KeyError, AttributeError) as exc:
            raise ConfigError(f"{path}:{n}: need a JSON object with 'text'") from exc
    if not out:
        raise ConfigError(f"perplexity texts {path}: empty")
    return out


async def perplexity(ctx: Context) -> Item:
    cand, ref = _endpoint(ctx, "candidate"), _endpoint(ctx, "reference")
    if cand is None or ref is None:
        return skipped(
            PERPLEXITY, TITLES[PERPLEXITY], "needs both --candidate and --reference endpoints"
        )
    c = ctx.config.perplexity
    texts = load_domain_texts(c.texts) if c.texts else list(ppl_mod.DEFAULT_TEXTS)
    ctx.progress(f"{PERPLEXITY}: scoring {len(texts)} domain texts on both sides")

    async def side(ep: Endpoint) -> tuple[list[list[float]], set[str]]:
        lps, methods = [], set()
        async with ep.client() as client:
            for t in texts:
                lp, method = await ep.continuation_logprobs(client, t.prompt, t.text)
                lps.append(lp)
                methods.add(method)
        return lps, methods

    try:
        (cl, cm), (rl, rm) = await asyncio.gather(side(cand), side(ref))
    except EndpointError as exc:
        return failed(
            PERPLEXITY,
            TITLES[PERPLEXITY],
            {},
            {"tolerance": c.tolerance},
            why=f"could not score: {exc}",
        )
    if cm != rm:
        return failed(
            PERPLEXITY,
            TITLES[PERPLEXITY],
            {},
            {"tolerance": c.tolerance},
            why=f"the sides score differently ({sorted(cm)} vs {sorted(rm)}): not comparable",
        )
    pc, pr = ppl_mod.perplexity(cl), ppl_mod.perplexity(rl)
    ok, why = ppl_mod.judge(pc, pr, c.tolerance)
    domains = sorted({t.domain for t in texts})
    per_domain = {
        d: {
            "candidate": round(
                ppl_mod.perplexity([lp for t, lp in zip(texts, cl, strict=True) if t.domain == d]),
                4,
            ),
            "reference": round(
                ppl_mod.perplexity([lp for t, lp in zip(texts, rl, strict=True) if t.domain == d]),
                4,
            ),
        }
        for d in domains
    }
    return judged(
        PERPLEXITY,
        TITLES[PERPLEXITY],
        ok,
        {
            "candidate": round(pc, 4),
            "reference": round(pr, 4),
            "rise": round(pc / pr - 1, 4),
            "tokens": sum(len(x) for x in cl),
            "texts": len(texts),
        },
        {"tolerance": c.tolerance},
        why=why,
        method=sorted(cm),
        per_domain=per_domain,
    )


# -- warmup --------------------------------------------------------------------------


def warmup_ratio(first_s: float, steady_s: list[float]) -> tuple[float, float]:
    """(steady p50, first / p50).

    >>> warmup_ratio(3.0, [1.0, 1.0, 2.0])
    (1.0, 3.0)
    """
    p50 = statistics.median(steady_s)
    return p50, (first_s / p50 if p50 > 0 else float("inf"))


async def warmup(ctx: Context) -> Item:
    cand = _endpoint(ctx, "candidate")
    c = ctx.config.warmup
    title = f"Cold start: first request per bucket <= {c.max_ratio:g}x steady p50"
    if cand is None:
        return skipped(WARMUP, title, "needs the --candidate endpoint")
    context = await _context_length(ctx, cand)
    buckets = [b for b in c.buckets if context is None or b < context - c.max_tokens]
    if not buckets:
        return skipped(WARMUP, title, f"no bucket fits the context length {context}")
    rows: list[dict[str, Any]] = []
    filler = niah_mod.Needle("The meeting ended on time.", "Summarise the notes.", "")
    async with cand.client() as client:
        for b in buckets:
            ctx.progress(f"{WARMUP}: bucket {b} tokens: 1 cold + {c.steady} steady requests")
            # A different haystack per request, so a prefix cache cannot make
            # the steady requests look cheaper than the cold one.
            times = []
            for k in range(c.steady + 1):
                prompt = niah_mod.haystack(b, filler, 0.5, seed=ctx.config.seed + 7919 * k + b)
                times.append((await cand.chat(client, prompt, c.max_tokens)).latency_s)
            p50, ratio = warmup_ratio(times[0], times[1:])
            rows.append(
                {
                    "bucket": b,
                    "first_s": round(times[0], 4),
                    "steady_p50_s": round(p50, 4),
                    "ratio": round(ratio, 3),
                    "times_s": [round(t, 4) for t in times],
                }
            )
    worst = max(rows, key=lambda r: r["ratio"])
    ok = all(r["ratio"] <= c.max_ratio for r in rows)
    why = (
        f"worst bucket {worst['bucket']}: first {worst['first_s']:.2f}s = {worst['ratio']:.2f}x p50"
    )
    return judged(
        WARMUP,
        title,
        ok,
        {"worst_ratio": worst["ratio"], "buckets": {str(r["bucket"]): r["ratio"] for r in rows}},
        {"max_ratio": c.max_ratio},
        why=why,
        rows=rows,
    )
