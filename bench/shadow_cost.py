"""The shadow cost estimate beside what the breaker's own fold measures.

    python bench/shadow_cost.py [--streams 60] [--seed 0] [--policy FILE] [--json]
                                [--write BENCHMARKS.md]

``quantdrift shadow cost`` says how many shadow pairs a route needs to catch a drift
(``evaluation/shadow_cost.py``: an analytic expected delay of the judge's e-process,
``BettingSR.expected_delay``). This bench checks that figure against the decision
core itself: for each drift, ``--streams`` seeded streams of synthetic scores whose
metrics show the drift at its rate from the first pair are folded through the same
path eval and replay take (``StreamFold`` on the in-memory store, whose fold is the
live worker's ``fold_many``), under the route's whole policy (every test, slices,
``min_pairs``), until the route opens. The table gives the estimate and the measured
mean, median and p90 delay in shadow pairs.

A drift's synthetic pair:

* ``hard=p``: the candidate's answer repeats itself (``repetition_run`` 6 of 40
  tokens, a hard failure the reference does not show) with probability ``p``; its
  task outcome is kept, so only the hard test sees it;
* ``outcomes=d``: the candidate breaks the JSON contract the reference keeps with
  probability ``d``; not a hard failure, so only the outcome test sees it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
from pathlib import Path
from typing import Any

import numpy as np
from common import policy_flag, write_section

from quantdrift.breaker.offline import StreamFold, offline_store
from quantdrift.breaker.policy import Policy, load_policy
from quantdrift.evaluation.shadow_cost import Drift, detection
from quantdrift.schemas import Metrics, ScoreEvent

SECTION = "## What a shadow share buys: the cost estimate against the breaker"
ROUTE = "bench/shadow-cost"
DRIFTS = (
    Drift("hard", 0.05),
    Drift("hard", 0.1),
    Drift("hard", 0.3),
    Drift("outcomes", 0.15),
    Drift("outcomes", 0.3),
)
LIMIT = 20_000  # pairs before a stream counts as missed


def drifted_metrics(drift: Drift, rng: np.random.Generator) -> Metrics:
    """One synthetic pair's metrics under ``drift`` (module docstring)."""
    hit = bool(rng.random() < drift.rate)
    if drift.signal == "hard":
        return Metrics(repetition_run=6 * hit, candidate_tokens=40, json_ok=True,
                       reference_json_ok=True)  # fmt: skip
    return Metrics(candidate_tokens=40, json_ok=not hit, reference_json_ok=True)


async def delay(policy: Policy, drift: Drift, seed: int, stream: int) -> int | None:
    """Shadow pairs folded until the route opened (None: not within ``LIMIT``)."""
    rng = np.random.default_rng([seed, stream])
    fold = StreamFold(offline_store(), policy)
    for i in range(LIMIT):
        score = ScoreEvent(
            pair_id=f"s{stream}-{i}", route=ROUTE, kind="shadow", ts=float(i),
            decoding="sampled", metrics=drifted_metrics(drift, rng),
        )  # fmt: skip
        for trip in await fold.fold(score, float(i)):
            if trip.transition.to_state == "open":
                return trip.index
    return None


def run(
    policy: Policy, streams: int, seed: int, drifts: tuple[Drift, ...] = DRIFTS
) -> list[dict[str, Any]]:
    """Per drift: the estimate and the measured delays."""
    rows = []
    route_policy = policy.for_route(ROUTE)
    for drift in drifts:
        found = detection(route_policy, drift)
        delays = [asyncio.run(delay(policy, drift, seed, k)) for k in range(streams)]
        caught = sorted(d for d in delays if d is not None)
        rows.append(
            {
                "drift": drift.label,
                "estimate": None if found.pairs is None else round(found.pairs, 1),
                "mean": round(statistics.fmean(caught), 1) if caught else None,
                "median": statistics.median(caught) if caught else None,
                "p90": caught[int(0.9 * (len(caught) - 1))] if caught else None,
                "missed": streams - len(caught),
                "streams": streams,
            }
        )
    return rows


def markdown(rows: list[dict[str, Any]], streams: int, seed: int, policy: str | None) -> str:
    lines = [
        SECTION,
        "",
        f"`python bench/shadow_cost.py --streams {streams} --seed {seed}{policy_flag(policy)}`:"
        " shadow pairs to the rollback, estimated and measured through the breaker's fold.",
        "",
        "| drift | estimate | measured mean | median | p90 | missed |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['drift']} | {r['estimate']} | {r['mean']} | {r['median']} | {r['p90']} "
            f"| {r['missed']} of {r['streams']} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=60)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--policy", default=None, help="a policy YAML file (default: built-in)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--write", type=Path, default=None, help="write the section here")
    args = parser.parse_args()
    policy = load_policy(None if args.policy is None else Path(args.policy))
    rows = run(policy, args.streams, args.seed)
    text = markdown(rows, args.streams, args.seed, args.policy) + "\n"
    if args.write:
        write_section(args.write, text, SECTION)
    if args.json:
        print(json.dumps({"streams": args.streams, "seed": args.seed, "rows": rows}))
    else:
        print(text, end="")


if __name__ == "__main__":
    main()
