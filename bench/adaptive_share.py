"""Adaptive shadow share against a flat one, on the recorded traffic corpus.

    python bench/adaptive_share.py [--corpus corpus/pairs] [--draws 60] [--requests 3000]
                                   [--floor 0.01] [--max 0.2] [--flat 0.05] [--json]

A route gets one user request per second. Each request is shadowed with the policy's
share; a shadowed request brings the next corpus pair of its stream (each evaluation
prompt at most once, as ``bench/eval_corpus.py`` builds streams through
:mod:`quantdrift.evaluation.corpus`), folded by the production decision
(``StreamFold``, teacher-forced scores, floors from one calibration draw). The adaptive
share is the gateway's own rule (``gateway/control/share.py``: ``evidence_of`` on the
route's state after each fold, then ``decide``; no cap), read at once rather than every
``refresh_s``. The shares draw the same uniforms per request (common random numbers), so
policies differ only by their share.

Per draw, over ``--requests`` requests:

* **healthy:** int8 all along: shadowed requests (pairs), reference tokens (the prompt
  and answer of the shadow run, plus the teacher-forced pass over prompt and candidate
  answer) and false rollbacks;
* **int4 / int3:** the GPTQ int4 or int3 build from a random request in the first half:
  the delay in user requests from the onset to the rollback (a stream whose pairs or
  requests end first is a miss).

Policies: flat ``--flat``; adaptive (``--floor`` .. ``--max``); and flat at the share
that spends what the adaptive rule spent on the healthy streams (equal reference spend).
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from quantdrift.breaker.offline import StreamFold
from quantdrift.config import EmbeddingSettings
from quantdrift.evaluation.corpus import ROUTE, CorpusEval, Scenario
from quantdrift.evaluation.long import quantile
from quantdrift.gateway.control.share import Meter, ShareRule, decide, evidence_of
from quantdrift.schemas import ScoreEvent
from quantdrift.services import corpus_eval
from quantdrift.services.corpus_eval import CorpusRequest

ROOT = Path(__file__).resolve().parent.parent
HEALTHY, INT4, INT3 = "int8", "int4-g64-gptq", "int3-g64"

ShareOf = Callable[[Any], float]  # the route's state (or None before any pair) -> share


@dataclass
class Run:
    pairs: int = 0
    tokens: int = 0
    delay: int | None = None
    false: int = 0


def input_tokens(prompts_file: Path) -> dict[str, int]:
    with gzip.open(prompts_file, "rt") as f:
        return {(d := json.loads(line))["prompt_id"]: int(d["input_tokens"]) for line in f}


def pair_tokens(ev: CorpusEval, pid: str, label: str, prompt_tokens: dict[str, int]) -> int:
    """Reference tokens one shadowed request costs: the shadow run (prompt + answer) and
    the teacher-forced pass (prompt + the candidate's answer)."""
    pair = ev.prompts[pid].shadow[label]
    n = prompt_tokens.get(pid, 0)
    return 2 * n + len(pair.reference.tokens or ()) + len(pair.candidate.tokens or ())


async def one(
    ev: CorpusEval,
    share_of: ShareOf,
    store: Any,
    order: Sequence[int],
    scores: dict[str, list[ScoreEvent]],
    tokens: dict[str, list[int]],
    variant: str | None,
    onset: int,
    uniforms: np.ndarray,
    tag: str,
) -> Run:
    """One stream: requests in turn, each shadowed when its uniform falls under the share."""
    fold = StreamFold(store.fork(), ev.policy)
    run, state, k = Run(), None, 0
    for r, u in enumerate(uniforms):
        if u >= share_of(state):
            continue
        if k >= len(order):
            break  # the stream's distinct prompts are used up
        i = order[k]
        k += 1
        label = variant if variant is not None and r >= onset else HEALTHY
        score = scores[label][i].model_copy(update={"pair_id": f"{tag}:{k}"})
        run.pairs += 1
        run.tokens += tokens[label][i]
        for trip in await fold.fold(score, float(r)):
            if trip.transition.to_state == "open":
                if label == HEALTHY:
                    run.false += 1
                else:
                    run.delay = r - onset + 1
                    return run
        state = await fold.state(ROUTE)
    return run


def adaptive(rule: ShareRule) -> ShareOf:
    def share_of(state: Any) -> float:
        ev = evidence_of(state.to_json() if state is not None else None)
        return decide(rule, ev, Meter()).share

    return share_of


def flat(share: float) -> ShareOf:
    return lambda _state: share


async def policy_runs(
    ev: CorpusEval, share_of: ShareOf, draws: int, requests: int, seed: int, cal: int,
    prompt_tokens: dict[str, int],
) -> dict[str, list[Run]]:  # fmt: skip
    prompts = [ev.prompts[pid] for pid in ev.eval_pool]
    labels = (HEALTHY, INT4, INT3)
    scores = {lab: [ev.score(p.shadow[lab]) for p in prompts] for lab in labels}
    tokens = {lab: [pair_tokens(ev, p.prompt_id, lab, prompt_tokens) for p in prompts]
              for lab in labels}  # fmt: skip
    out: dict[str, list[Run]] = {"healthy": [], INT4: [], INT3: []}
    for d in range(draws):
        store = await ev.floors(cal, d, seed)
        rng = np.random.default_rng([seed, d, 7])
        order = Scenario("traffic mix").order(prompts, rng)
        onset = int(rng.integers(0, requests // 2))
        uniforms = rng.random(requests)
        out["healthy"].append(
            await one(ev, share_of, store, order, scores, tokens, None, 0, uniforms, f"{d}h")
        )
        for v in (INT4, INT3):
            out[v].append(
                await one(ev, share_of, store, order, scores, tokens, v, onset, uniforms, f"{d}{v}")
            )
    return out


def summary(name: str, runs: dict[str, list[Run]], requests: int) -> dict[str, Any]:
    h = runs["healthy"]
    pairs = float(np.mean([r.pairs for r in h]))
    tokens = float(np.mean([r.tokens for r in h]))
    row: dict[str, Any] = {
        "policy": name,
        "healthy_pairs_per_1k_requests": round(1000 * pairs / requests, 2),
        "healthy_reference_tokens_per_request": round(tokens / requests, 2),
        "false_rollbacks": sum(r.false for r in h),
    }
    for v in (INT4, INT3):
        caught = [float(r.delay) for r in runs[v] if r.delay is not None]
        row[f"{v}_p50"] = quantile(caught, 0.5)
        row[f"{v}_p90"] = quantile(caught, 0.9) if len(caught) == len(runs[v]) else None
        row[f"{v}_missed"] = len(runs[v]) - len(caught)
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", type=Path, default=ROOT / "corpus" / "pairs")
    ap.add_argument("--prompts", type=Path, default=None, help="default: beside --corpus")
    ap.add_argument("--draws", type=int, default=60)
    ap.add_argument("--requests", type=int, default=3000, help="user requests per stream")
    ap.add_argument("--calibration", type=int, default=75, help="calibration prompts")
    ap.add_argument("--floor", type=float, default=0.01)
    ap.add_argument("--max", type=float, default=0.2)
    ap.add_argument("--flat", type=float, default=0.05)
    ap.add_argument("--calm", type=float, default=0.5)
    ap.add_argument("--slice-want", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if not args.corpus.exists():
        sys.exit(f"{args.corpus} is missing (quantdrift lab corpus record writes it)")
    t0 = time.perf_counter()
    request = CorpusRequest(
        pairs=args.corpus, healthy_label=HEALTHY, variants=(INT4, INT3),
        calibration_prompts=args.calibration, calibration_pool=args.calibration,
        logprobs="full", seed=args.seed,
    )  # fmt: skip
    ev = corpus_eval.load(EmbeddingSettings(), request)
    prompt_tokens = input_tokens(args.prompts or args.corpus.parent / "prompts.jsonl.gz")
    rule = ShareRule(floor=args.floor, max=args.max, calm=args.calm, slice_want=args.slice_want)

    def go(share_of: ShareOf) -> dict[str, list[Run]]:
        return asyncio.run(
            policy_runs(
                ev, share_of, args.draws, args.requests, args.seed, args.calibration, prompt_tokens
            )
        )

    rows = []
    runs = go(adaptive(rule))
    name = f"adaptive {args.floor:g}..{args.max:g} (calm {args.calm:g}, slices {args.slice_want:g})"
    rows.append(summary(name, runs, args.requests))
    # The flat share that spends what the adaptive rule spent on the healthy streams.
    spent = float(np.mean([r.tokens for r in runs["healthy"]]))
    per_pair = float(np.mean([r.tokens / r.pairs for r in runs["healthy"] if r.pairs]))
    equal = round(spent / per_pair / args.requests, 4)
    for share in (args.flat, equal):
        rows.append(summary(f"flat {share:g}", go(flat(share)), args.requests))
    result = {
        "bench": "adaptive_share",
        "draws": args.draws,
        "requests": args.requests,
        "distinct_eval_prompts": len(ev.eval_pool),
        "calibration_prompts": args.calibration,
        "equal_spend_flat_share": equal,
        "rows": rows,
        "seconds": round(time.perf_counter() - t0, 1),
    }
    print(json.dumps(result) if args.json else markdown(result))
    return 0


def matched(result: dict[str, Any]) -> dict[str, float] | None:
    """The flat share that would catch int4 at the adaptive rule's median, and its spend.

    Derived, not run: under a flat share the stream's pairs and their order do not depend
    on the share, only the requests between them, so a flat share's delay in requests is
    its delay in pairs over the share, and its spend per request is proportional to it.
    From the ``--flat`` row: ``share * its median / the adaptive median``.
    """
    rows = result["rows"]
    ad, fl = rows[0], rows[1]
    a, f = ad[INT4 + "_p50"], fl[INT4 + "_p50"]
    if not a or not f:
        return None
    share = float(fl["policy"].split()[1])
    m = share * f / a
    tokens = fl["healthy_reference_tokens_per_request"] * m / share
    saved = 1 - ad["healthy_reference_tokens_per_request"] / tokens
    return {"share": round(m, 4), "tokens_per_request": round(tokens, 1), "saved": round(saved, 3)}


def _d(x: float | None) -> str:
    return "-" if x is None else f"{x:g}"


def markdown(result: dict[str, Any]) -> str:
    lines = [
        f"{result['draws']} draws, {result['requests']} user requests per stream (one a second), "
        f"{result['distinct_eval_prompts']} distinct evaluation prompts, calibration "
        f"{result['calibration_prompts']} prompts; flat share at equal spend: "
        f"{result['equal_spend_flat_share']:g}. Delays in user requests from the onset "
        "(p90: '-' when a stream missed).",
        "",
        "| policy | healthy pairs / 1k requests | reference tokens / request | false rollbacks "
        "| int4 p50 / p90 (missed) | int3 p50 / p90 (missed) |",
        "|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        lines.append(
            f"| {r['policy']} | {r['healthy_pairs_per_1k_requests']:g} | "
            f"{r['healthy_reference_tokens_per_request']:g} | {r['false_rollbacks']} | "
            f"{_d(r[INT4 + '_p50'])} / {_d(r[INT4 + '_p90'])} ({r[INT4 + '_missed']}) | "
            f"{_d(r[INT3 + '_p50'])} / {_d(r[INT3 + '_p90'])} ({r[INT3 + '_missed']}) |"
        )
    m = matched(result)
    if m is not None:
        lines += [
            "",
            f"A flat share catching int4 at the adaptive median would be {m['share']:g}, "
            f"spending {m['tokens_per_request']:g} reference tokens per request on healthy "
            f"traffic: the adaptive rule spends {100 * m['saved']:.0f} % less (derived from "
            "the flat row: a flat share's delay in requests is its delay in pairs over the "
            "share).",
        ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
