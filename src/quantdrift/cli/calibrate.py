"""``quantdrift calibrate PAIRS.jsonl[.gz] [--route R] [--redis-url URL] [--key-prefix P]``.

Seeds the noise floor in Redis, per route and decoding mode, from the file's
``noise`` pairs (reference vs reference): they are scored like the worker
scores them, and each mode's floor is written with the breaker store's
compare-and-set (``BreakerStore.seed_floor``, which ``quantdrift eval`` calls on its
in-memory store; the keys the worker reads, ``{prefix}route:{ROUTE}:noise:MODE``).

Without ``--route`` each route calibrates from its own noise pairs; with
``--route R`` (repeatable) all the file's noise pairs calibrate R, e.g. the
lab's ``lab/noise`` pairs for a gateway's ``cs-agent/int4``. Each mode's floor
comes from that mode's pairs only: identical greedy runs say nothing, and a
greedy floor is never borrowed from sampled pairs. ``--blessed-label L`` adds
the file's shadow pairs of candidate L (a candidate run the operator approved:
the pair's label, or, for a gateway's pairs, which carry none, the candidate's
precision, served model name or engine identity) as the blessed baseline,
which the tolerance rule prefers for every metric where
it is informative (see :mod:`quantdrift.evaluation.calibration`). ``--part
calibration`` keeps only the prompts of that part of the lab's split. The
floor is replaced unless ``--merge``. ``--embedder`` builds exactly the scorer
it names (default: the worker's).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

EMBEDDERS = ("minilm", "tiered", "static", "none")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("calibrate", help="seed the per-route noise floor in Redis from noise pairs")
    p.add_argument("pairs", type=Path, help="PairEvent JSONL(.gz) holding noise pairs")
    p.add_argument("--route", action="append", default=None, help="route to calibrate (repeat)")
    p.add_argument("--redis-url", default=None, help="default: settings or the running stack")
    p.add_argument("--key-prefix", default=None, help="default: settings (qd:)")
    p.add_argument(
        "--embedder", choices=EMBEDDERS, default=None, help="default: the worker's scorer"
    )
    p.add_argument(
        "--blessed-label",
        default=None,
        help="the blessed baseline: shadow pairs whose label, candidate precision, served model "
        "or engine identity (vllm/0.32.0/int8) is one of these, comma-separated",
    )
    p.add_argument("--part", choices=("calibration", "evaluation"), default=None)
    p.add_argument("--merge", action="store_true", help="append to the floor instead of replacing")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.add_argument(
        "--json", action="store_true", help="print one JSON array: an object per floor written"
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # Deferred: the service loads the scorers and redis, which `quantdrift --help` never needs.
    from quantdrift.cli.common import load_settings, with_stack
    from quantdrift.cli.progress import self_closing
    from quantdrift.services.calibration import CalibrationRequest, calibrate

    settings = with_stack(load_settings())
    request = CalibrationRequest(
        pairs=args.pairs,
        routes=tuple(args.route or ()),
        blessed=tuple(v.strip() for v in (args.blessed_label or "").split(",") if v.strip()),
        part=args.part,
        merge=args.merge,
        embedder=args.embedder,
    )
    rows = calibrate(
        settings,
        request,
        args.redis_url,
        args.key_prefix,
        progress=self_closing(not args.no_progress, "score pairs"),
    )
    if args.json:
        print(json.dumps(rows))
        return 0
    for row in rows:
        print(
            f"{row['route']} {row['mode']}: {row['seeded']} noise pairs "
            f"({row['source']}), floor now {row['floor_pairs']}"
        )
    return 0
