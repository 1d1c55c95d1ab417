"""Scoring throughput and latency on ~200-token pairs, three scorers in ONE run.

    python bench/scoring.py [--pairs N] [--json] [--write BENCHMARKS.md]

(a) ``naive``: one pair at a time, the seeds' style — MiniLM on the pair's two
    texts (one unbatched ``encode``, no cache), rouge-score and sacrebleu
    reference implementations, then entropy, repetition and JSON checks;
(b) ``minilm``: the full suite (:func:`quantdrift.detectors.score_pairs`) with
    MiniLM on every pair, batches of ``--batch`` (the worker's ``batch_max``);
(c) ``tiered``: the full suite with the static tier on every pair and MiniLM
    only on escalated pairs (:class:`quantdrift.embedding.tiered.TieredScorer`).

Single process, torch with 1 thread: per-worker numbers (run one worker
process per core). Per-pair latency of a batched scorer is the batch's wall
time divided by its size (what the worker's ``scoring_seconds`` records); the
``tiered_at_load`` row also gives the true wait of a pair when pairs arrive at
200/s and the worker batches what came in its 20 ms window (batches of ~4).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import long_pairs, machine, write_section

from quantdrift.schemas import PairEvent

SECTION = "## Scoring speed (bench/scoring.py)"


def _pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    k = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[k]


def _row(name: str, n: int, wall: float, per_pair_s: Sequence[float], **extra: Any) -> dict:
    return {
        "scorer": name,
        "pairs": n,
        "pairs_per_s": n / wall if wall > 0 else float("inf"),
        "p50_ms": _pct(per_pair_s, 50) * 1e3,
        "p99_ms": _pct(per_pair_s, 99) * 1e3,
        **extra,
    }


def naive_scorer() -> Callable[[PairEvent], None]:
    from rouge_score import rouge_scorer
    from sacrebleu.metrics import BLEU

    from quantdrift.detectors import entropy as ent
    from quantdrift.detectors import repetition as rep
    from quantdrift.detectors.json_contract import check_json_contract
    from quantdrift.detectors.tokenize import tokenize
    from quantdrift.embedding.minilm import _load_sentence_transformer, resolve_model_path

    model = _load_sentence_transformer(resolve_model_path("packaged:all-MiniLM-L6-v2"), 1)
    rouge = rouge_scorer.RougeScorer(["rouge1", "rougeL"], use_stemmer=False)
    bleu = BLEU(effective_order=True)

    def score(p: PairEvent) -> None:
        emb = model.encode(
            [p.candidate.text, p.reference.text],
            normalize_embeddings=True,
            convert_to_numpy=True,
            show_progress_bar=False,
        )
        float(emb[0] @ emb[1])
        rouge.score(p.reference.text, p.candidate.text)
        bleu.sentence_score(p.candidate.text, [p.reference.text])
        ids = rep.token_ids(tokenize(p.candidate.text))
        rep.repetition_run(ids), rep.looping(ids), rep.distinct_2(ids)
        ent.entropy_stats(ent.token_entropies(p.candidate))
        check_json_contract(p.candidate.text, p.request)

    return score


def run_naive(pairs: Sequence[PairEvent]) -> dict:
    score = naive_scorer()
    score(pairs[0])  # warm-up
    lat: list[float] = []
    start = time.perf_counter()
    for p in pairs:
        t = time.perf_counter()
        score(p)
        lat.append(time.perf_counter() - t)
    return _row("naive (one pair at a time)", len(pairs), time.perf_counter() - start, lat)


def run_batched(
    name: str, score: Callable[[Sequence[PairEvent]], Any], pairs: Sequence[PairEvent], batch: int
) -> dict:
    warm = min(batch, 8)
    score(pairs[:warm])  # warm-up (the caches are keyed by text: warm-up texts never recur)
    lat: list[float] = []
    batch_ms: list[float] = []
    start = time.perf_counter()
    for i in range(warm, len(pairs), batch):
        chunk = pairs[i : i + batch]
        t = time.perf_counter()
        score(chunk)
        dt = time.perf_counter() - t
        lat.extend([dt / len(chunk)] * len(chunk))
        batch_ms.append(dt * 1e3)
    n = len(pairs) - warm
    return _row(
        name,
        n,
        time.perf_counter() - start,
        lat,
        batch=batch,
        batch_p50_ms=_pct(batch_ms, 50),
        batch_p99_ms=_pct(batch_ms, 99),
    )


def stages(pairs: Sequence[PairEvent], static: Any, full: Any) -> dict[str, float]:
    """µs per pair of each stage, on the same pairs (the suite's implementations)."""
    from rouge_score import rouge_scorer

    from quantdrift.detectors import bleu
    from quantdrift.detectors import entropy as ent
    from quantdrift.detectors import lexical as lex
    from quantdrift.detectors import repetition as rep
    from quantdrift.detectors.json_contract import check_json_contract
    from quantdrift.detectors.semantic import cosine_pairs
    from quantdrift.detectors.tokenize import tokenize

    cands = [p.candidate.text for p in pairs]
    refs = [p.reference.text for p in pairs]
    n = len(pairs)
    out: dict[str, float] = {}

    def timed(key: str, fn: Callable[[], Any], count: int = n) -> None:
        t = time.perf_counter()
        fn()
        out[key] = (time.perf_counter() - t) / count * 1e6

    timed("embedding_static", lambda: cosine_pairs(static, cands, refs))
    sub = 16
    timed(
        "embedding_minilm",
        lambda: cosine_pairs(full, [c + " ." for c in cands[:sub]], [r + " ." for r in refs[:sub]]),
        sub,
    )
    toks = [(tokenize(c), tokenize(r)) for c, r in zip(cands, refs, strict=True)]

    def lexical() -> None:
        for (ct, rt), c, r in zip(toks, cands, refs, strict=True):
            bleu.sentence_bleu(c, r)
            lex.rouge1_f(ct, rt), lex.rougeL_f(ct, rt), lex.jaccard(ct, rt)
            lex.length_ratio(ct, rt), lex.first_divergence(ct, rt)

    timed(
        "tokenize", lambda: [(tokenize(c), tokenize(r)) for c, r in zip(cands, refs, strict=True)]
    )
    timed("lexical", lexical)
    scorer = rouge_scorer.RougeScorer(["rouge1", "rougeL"], use_stemmer=False)
    timed(
        "lexical_rouge_score_ref",
        lambda: [scorer.score(r, c) for c, r in zip(cands, refs, strict=True)],
    )
    timed(
        "entropy",
        lambda: [
            (ent.entropy_stats(ent.token_entropies(p.candidate)), ent.token_entropies(p.reference))
            for p in pairs
        ],
    )

    def repetition() -> None:
        for ct, rt in toks:
            ids, rids = rep.token_ids(ct), rep.token_ids(rt)
            rep.repetition_run(ids), rep.looping(ids), rep.distinct_2(ids)
            rep.repetition_run(rids), rep.looping(rids)
        for c, r in zip(cands, refs, strict=True):
            rep.whitespace_run(c), rep.whitespace_run(r)

    timed("repetition", repetition)
    timed("json", lambda: [check_json_contract(p.candidate.text, p.request) for p in pairs])
    return out


def verdict_agreement(
    pairs: Sequence[PairEvent],
    static: Any,
    full: Any,
    calibration: Any,
    rate: float | None,
    batch: int,
) -> dict[str, Any]:
    """Pair verdicts of the tiered scorer against MiniLM on every pair: the share that
    agree, and how many pairs in the band the draw kept on the static cosine."""
    from quantdrift.detectors.suite import score_pairs, verdict
    from quantdrift.embedding.tiered import Escalation, TieredScorer

    escalation = Escalation() if rate is None else Escalation(rate=rate)
    tiered = TieredScorer(static, full, calibration, escalation)
    mine: list[str] = []
    reference: list[str] = []
    for i in range(0, len(pairs), batch):
        chunk = pairs[i : i + batch]
        mine += [verdict(m)[0] for m in tiered.score_pairs(chunk)]
        reference += [verdict(m)[0] for m in score_pairs(chunk, full)]
    agree = sum(a == b for a, b in zip(mine, reference, strict=True))
    return {
        "pairs": len(pairs),
        "agreement": round(agree / len(pairs), 4) if pairs else None,
        "disagreements": len(pairs) - agree,
        "passed_over": tiered.agreement.summary()["passed_over"],
    }


CORPUS_SAMPLE = 180  # pairs of the traffic corpus the verdicts are compared on


def corpus_pairs(
    part: Literal["calibration", "evaluation"], limit: int = CORPUS_SAMPLE, seed: int = 0
) -> list[PairEvent]:
    """A seeded sample of ``limit`` pairs (noise and shadow, in corpus order) of the
    traffic corpus's calibration pool or evaluation prompts, cut as
    ``bench/eval_corpus.py`` cuts it: recorded traffic, not the lab's 40 prompts."""
    import numpy as np
    from eval_corpus import ROOT, cut

    from quantdrift.evaluation.corpus import prompt_of
    from quantdrift.services.pairs import read_pairs

    pairs = read_pairs(ROOT / "corpus" / "pairs")
    calibration, evaluation = cut(pairs)
    keep = calibration if part == "calibration" else evaluation
    mine = [p for p in pairs if prompt_of(p) in keep]
    picked = np.random.default_rng([seed, 3]).permutation(len(mine))[:limit]
    return [mine[int(i)] for i in sorted(picked)]


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=1024, help="pairs for the tiered scorer")
    ap.add_argument("--minilm-pairs", type=int, default=128)
    ap.add_argument("--naive-pairs", type=int, default=24)
    ap.add_argument("--batch", type=int, default=64, help="the worker's batch_max")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--rate",
        type=float,
        default=None,
        help="band escalation rate (default: the setting's)",
    )
    ap.add_argument("--json", action="store_true", help="end with one JSON object")
    ap.add_argument("--write", type=Path, default=None, help="write/update a section in this file")
    args = ap.parse_args(argv)

    import torch

    torch.set_num_threads(1)
    from quantdrift.detectors.suite import score_pairs
    from quantdrift.embedding.minilm import SentenceTransformerEmbedder
    from quantdrift.embedding.static import StaticEmbedder, load_calibration
    from quantdrift.embedding.tiered import Escalation, TieredScorer

    started = time.perf_counter()
    total = args.pairs + 8
    pairs = long_pairs(total + args.minilm_pairs + 8 + args.naive_pairs + 400, seed=args.seed)
    tiered_pairs = pairs[:total]
    rest = pairs[total:]
    minilm_pairs, rest = (
        rest[: args.minilm_pairs + 8],
        rest[args.minilm_pairs + 8 :],
    )
    naive_pairs, load_pairs = rest[: args.naive_pairs], rest[args.naive_pairs :]

    full = SentenceTransformerEmbedder(threads=1)
    static = StaticEmbedder()
    calibration = load_calibration(static.path)
    escalation = Escalation() if args.rate is None else Escalation(rate=args.rate)
    tiered = TieredScorer(static, full, calibration, escalation)

    rows = [
        run_naive(naive_pairs),
        run_batched(
            "minilm (every pair, batched)", lambda b: score_pairs(b, full), minilm_pairs, args.batch
        ),
        run_batched("tiered (static + escalation)", tiered.score_pairs, tiered_pairs, args.batch),
    ]
    agreement = tiered.agreement.summary()
    # At the target load: 200 pairs/s and a 20 ms batching window = batches of 4.
    at_load = TieredScorer(static, full, calibration, escalation)
    rows.append(
        run_batched("tiered at 200 pairs/s (batches of 4)", at_load.score_pairs, load_pairs, 4)
    )
    agreement_rows = {
        "bench": verdict_agreement(
            minilm_pairs[8:], static, full, calibration, args.rate, args.batch
        ),
        "corpus_evaluation": verdict_agreement(
            corpus_pairs("evaluation"), static, full, calibration, args.rate, args.batch
        ),
    }
    naive_rate = rows[0]["pairs_per_s"]
    for r in rows:
        r["vs_naive"] = r["pairs_per_s"] / naive_rate
    breakdown = stages(tiered_pairs[:128], static, full)
    mean_words = statistics.mean(len(p.candidate.text.split()) for p in pairs[:200])
    ref_tokens = statistics.mean(len(static.token_ids([p.reference.text])[0]) for p in pairs[:200])
    result = {
        "tiered_pairs_per_s": rows[2]["pairs_per_s"],
        "tiered_p50_ms": rows[2]["p50_ms"],
        "tiered_p99_ms": rows[2]["p99_ms"],
        "tiered_batch_p99_ms": rows[2]["batch_p99_ms"],
        "tiered_at_load_batch_p99_ms": rows[3]["batch_p99_ms"],
        "tiered_at_load_pairs_per_s": rows[3]["pairs_per_s"],
        "minilm_pairs_per_s": rows[1]["pairs_per_s"],
        "minilm_p99_ms": rows[1]["p99_ms"],
        "naive_pairs_per_s": naive_rate,
        "naive_p99_ms": rows[0]["p99_ms"],
        # Pairs in the band that the draw kept on the static cosine.
        "passed_over": agreement["passed_over"],
        # Pair verdicts (ok / drift / anomaly), tiered vs MiniLM on every pair, same pairs.
        "verdict_agreement": agreement_rows["bench"]["agreement"],
        "verdict_agreement_detail": agreement_rows,
        "escalation": agreement,
        "escalation_rate": escalation.rate,
        "calibration": {
            "fitted_on": calibration.fitted_on,
            "band": tiered.band,
            "spearman": calibration.spearman,
        },
        "stage_us_per_pair": breakdown,
        "rows": rows,
        "input": {"reference_word_pieces_mean": ref_tokens, "candidate_words_mean": mean_words},
        "machine": machine(),
        "seconds": time.perf_counter() - started,
    }
    print(_table(rows, breakdown, result))
    if args.write:
        write_section(args.write, _markdown(rows, breakdown, result), SECTION)
        print(f"wrote {args.write}")
    if args.json:
        print(json.dumps(result))
    return 0


def _table(rows: list[dict], breakdown: dict[str, float], result: dict) -> str:
    lines = [
        f"{'scorer':40} {'pairs/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'batch p99':>10} {'x naive':>8}"
    ]
    for r in rows:
        bp = f"{r['batch_p99_ms']:.1f}" if "batch_p99_ms" in r else "-"
        lines.append(
            f"{r['scorer']:40} {r['pairs_per_s']:9.1f} {r['p50_ms']:8.2f} {r['p99_ms']:8.2f} "
            f"{bp:>10} {r['vs_naive']:8.1f}"
        )
    lines.append("stage µs/pair: " + ", ".join(f"{k} {v:.0f}" for k, v in breakdown.items()))
    e = result["escalation"]
    lines.append(
        f"escalated {e['escalated']}/{e['pairs']} (band {e['escalated_band']}, "
        f"sample {e['escalated_sample']}); "
        f"sample |static-minilm| {e['sample_mean_abs_error']}"
    )
    return "\n".join(lines)


def _markdown(rows: list[dict], breakdown: dict[str, float], result: dict) -> str:
    m = result["machine"]
    e = result["escalation"]
    out = [
        SECTION,
        "",
        f"Machine: {m['nproc']} cores, {m['cpu']}; Python {m['python']}, torch {m['torch']}, "
        f"sentence-transformers {m['sentence-transformers']}, model2vec {m['model2vec']}. "
        "One process, torch 1 thread (per-worker numbers). Pairs of "
        f"~{result['input']['reference_word_pieces_mean']:.0f} word pieces per side, seeded.",
        "",
        "| scorer | pairs/s | p50 ms/pair | p99 ms/pair | batch p99 ms | × naive |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        bp = f"{r['batch_p99_ms']:.1f}" if "batch_p99_ms" in r else "-"
        out.append(
            f"| {r['scorer']} | {r['pairs_per_s']:.1f} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} "
            f"| {bp} | {r['vs_naive']:.1f} |"
        )
    out += [
        "",
        "Per-pair latency of a batched scorer = batch wall time / batch size; "
        "batch p99 = the wait of a pair for its whole batch.",
        "",
        "Stages (µs per pair, suite implementations; rouge-score shown for reference): "
        + ", ".join(f"{k} {v:.0f}" for k, v in breakdown.items())
        + ".",
        "",
        f"Tiered escalation: {e['escalated']} of {e['pairs']} pairs "
        f"({100 * (e['escalation_rate'] or 0):.1f} %: band {e['escalated_band']}, "
        f"sample {e['escalated_sample']}); band "
        f"±{result['calibration']['band']:.3f} around 0.88, escalation rate "
        f"{result['escalation_rate']}, calibration: {result['calibration']['fitted_on']}. "
        f"**{result['passed_over']} pairs in the band kept the static cosine** (a pair d "
        "band widths from the bar escalates with probability min(1, rate / d), drawn from "
        "its texts, so every worker escalates the same pairs).",
        "",
        "Pair-verdict agreement, tiered against MiniLM on every pair (same pairs):",
        "",
        "| pairs | n | agreement | disagreements | in band, not escalated |",
        "|---|---:|---:|---:|---:|",
        *(
            f"| {name} | {a['pairs']} | {a['agreement']} | {a['disagreements']} "
            f"| {a['passed_over']} |"
            for name, a in result["verdict_agreement_detail"].items()
        ),
        "",
    ]
    return "\n".join(out)


if __name__ == "__main__":
    raise SystemExit(main())
