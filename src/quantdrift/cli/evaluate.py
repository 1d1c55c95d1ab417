"""``quantdrift eval --healthy H.jsonl [--drifted D.jsonl] [--calibrate N.jsonl] ...``.

Replays labelled PairEvent files through the judge in memory (no broker, no
Redis, no side effects): every pair is scored once, then judged under four
policies built from ``--policy`` (default: the built-in one): ``seeds`` (the
seeds' K-consecutive rule with their thresholds), ``windowed``, ``sequential``
and ``all`` (the policy's own rules). How the files are merged into per-route
streams is documented in :mod:`quantdrift.evaluation.streams`; what is counted
in :mod:`quantdrift.evaluation.runner`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from quantdrift.cli.common import positive_int


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("eval", help="false rollbacks and detection delay per policy, offline")
    p.add_argument("--healthy", type=Path, required=True, help="PairEvent JSONL(.gz)")
    p.add_argument("--drifted", type=Path, default=None, help="PairEvent JSONL(.gz)")
    p.add_argument("--calibrate", type=Path, default=None, help="noise pairs to seed the floor")
    p.add_argument("--healthy-label", type=_labels, default=None, help="keep only these labels")
    p.add_argument("--drifted-label", type=_labels, default=None, help="keep only these labels")
    p.add_argument("--policy", type=Path, default=None, help="YAML policy (default: built-in)")
    p.add_argument("--embedder", choices=("minilm", "tiered", "static", "none"), default="minilm")
    p.add_argument("--repeat", type=positive_int, default=1, help="replay the healthy part N times")
    p.add_argument(
        "--noise-as-shadow",
        action="store_true",
        help="judge every other noise pair of --healthy as a shadow pair (the rest feed the floor)",
    )
    p.add_argument("--pair-interval", type=float, default=1.0, help="simulated seconds per pair")
    p.add_argument("--json", action="store_true", help="one JSON object per policy per line")
    p.set_defaults(func=run)


def _labels(text: str) -> tuple[str, ...]:
    names = tuple(v.strip() for v in text.split(",") if v.strip())
    if not names:
        raise argparse.ArgumentTypeError("give at least one label")
    return names


def _fail(message: str) -> int:
    sys.stderr.write(f"quantdrift: error: {message}\n")
    return 2


def select(pairs: list, labels: tuple[str, ...] | None) -> list:  # type: ignore[type-arg]
    """Pairs whose label or candidate precision is one of ``labels`` (None keeps all)."""
    if labels is None:
        return pairs
    return [p for p in pairs if p.label in labels or p.candidate.precision in labels]


def run(args: argparse.Namespace) -> int:
    from quantdrift.breaker.policy import load_policy
    from quantdrift.cli.common import load_settings
    from quantdrift.demo.sources import read_pairs
    from quantdrift.evaluation import (
        ScoreCache,
        build_plan,
        evaluate,
        format_table,
        standard_policies,
    )

    for path in (args.healthy, args.drifted, args.calibrate, args.policy):
        if path is not None and not path.exists():
            return _fail(f"no such file: {path}")
    if args.pair_interval <= 0:
        return _fail(f"--pair-interval must be > 0, got {args.pair_interval}")
    policy = load_policy(args.policy)
    healthy = select(read_pairs(args.healthy), args.healthy_label)
    drifted = select(read_pairs(args.drifted), args.drifted_label) if args.drifted else []
    calibrate = read_pairs(args.calibrate) if args.calibrate else []
    if not healthy:
        return _fail(f"{args.healthy}: no pairs (after --healthy-label)")
    plan = build_plan(
        healthy, drifted, calibrate, repeat=args.repeat, noise_as_shadow=args.noise_as_shadow
    )
    if not plan.streams:
        return _fail(f"{args.healthy}: no shadow pairs to judge (try --noise-as-shadow)")
    embedder = None
    if args.embedder == "minilm":
        from quantdrift.detectors import SentenceTransformerEmbedder

        e = load_settings().embedding
        embedder = SentenceTransformerEmbedder(model=e.model, batch_size=e.batch_size, threads=1)
    cache = ScoreCache(embedder)
    results = evaluate(plan, cache, standard_policies(policy), pair_interval_s=args.pair_interval)
    for note in plan.notes:
        sys.stderr.write(f"eval: {note}\n")
    if args.json:
        for r in results:
            print(json.dumps(r.as_dict()))
    else:
        print(format_table(results))
        rate = cache.pairs_per_s
        print(
            f"scoring: {cache.scored} pairs once, "
            f"{'-' if rate is None else f'{rate:.0f}'} pairs/s ({args.embedder})"
        )
    return 0
