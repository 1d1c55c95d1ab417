"""``quantdrift eval --healthy H.jsonl [--drifted D.jsonl] [--calibrate N.jsonl] ...``.

Replays labelled PairEvent files through the judge in memory (no broker, no
Redis, no side effects): every distinct pair is scored once (metrics cached by
content), then judged under named policies: ``default`` (the production default,
or ``--policy`` as written), ``seeds`` (the seeds' K-consecutive rule with their
thresholds), and on request ``windowed`` and ``sequential``.

Two ways to run:

* ``--streams K --length N --seed S``: K seeded streams of N healthy shadow pairs
  resampled from ``--healthy``, each followed by ``--drift-length`` pairs
  resampled from ``--drifted`` (one pool per ``--drifted-label`` value, each
  starting from the same healthy streams); one JSON array (``--json``), an object
  per policy and pool, with
  false rollbacks per 100k healthy pairs (and the 95 % upper bound), detection
  delay median / p90 and missed streams (:mod:`quantdrift.evaluation.long`).
* without ``--streams``: the files as they are, in file order (``--repeat`` to
  replay the healthy part), per-route results (:mod:`quantdrift.evaluation.runner`).

``--holdout`` keeps the lab's prompt split honest: streams use only the
evaluation part of the prompts, floors and blessed baselines only the
calibration part. ``--embedder`` builds exactly the scorer it names; its
default is the scorer the worker uses (settings ``embedding.tier``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from quantdrift.cli.common import add_seconds, positive_int

POLICY_NAMES = ("default", "seeds", "windowed", "sequential")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("eval", help="false rollbacks and detection delay per policy, offline")
    p.add_argument("--healthy", type=Path, required=True, help="PairEvent JSONL(.gz)")
    p.add_argument("--drifted", type=Path, default=None, help="PairEvent JSONL(.gz)")
    p.add_argument(
        "--calibrate",
        type=Path,
        default=None,
        help="noise pairs (and --blessed-label shadow pairs) that seed the floor",
    )
    p.add_argument("--healthy-label", type=_labels, default=None, help="keep only these labels")
    p.add_argument("--drifted-label", type=_labels, default=None, help="keep only these labels")
    p.add_argument(
        "--blessed-label",
        type=_labels,
        default=None,
        help="shadow pairs of --calibrate with these labels are the blessed baseline",
    )
    p.add_argument("--policy", type=Path, default=None, help="YAML policy (default: built-in)")
    p.add_argument(
        "--policies",
        type=_policies,
        default=("default", "seeds"),
        help=f"comma-separated, from {', '.join(POLICY_NAMES)} (default: default,seeds)",
    )
    p.add_argument(
        "--embedder",
        choices=("minilm", "tiered", "static", "none"),
        default=None,
        help="the scorer to build (default: the worker's, settings embedding.tier)",
    )
    p.add_argument("--decoding", choices=("any", "greedy", "sampled"), default="any")
    p.add_argument(
        "--logprobs",
        choices=("full", "no-teacher-forcing", "none"),
        default="full",
        help="strip the pairs to what a gateway without (teacher-forced) log-probs sends",
    )
    p.add_argument(
        "--holdout",
        action="store_true",
        help="streams from the evaluation part of the prompts, floors from the calibration part",
    )
    p.add_argument("--streams", type=positive_int, default=None, help="K seeded long streams")
    p.add_argument("--length", type=positive_int, default=5000, help="healthy pairs per stream")
    p.add_argument("--drift-length", type=positive_int, default=200, help="drifted pairs/stream")
    p.add_argument("--seed", type=int, default=0, help="seed of the resampling")
    p.add_argument("--repeat", type=positive_int, default=1, help="replay the healthy part N times")
    p.add_argument(
        "--noise-as-shadow",
        action="store_true",
        help="judge every other noise pair of --healthy as a shadow pair (the rest feed the floor)",
    )
    add_seconds(p, "pair-interval", 1.0, "simulated seconds per pair")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.add_argument("--json", action="store_true", help="print one JSON array: an object per policy")
    p.set_defaults(func=run)


def _labels(text: str) -> tuple[str, ...]:
    names = tuple(v.strip() for v in text.split(",") if v.strip())
    if not names:
        raise argparse.ArgumentTypeError("give at least one label")
    return names


def _policies(text: str) -> tuple[str, ...]:
    names = _labels(text)
    bad = [n for n in names if n not in POLICY_NAMES]
    if bad:
        raise argparse.ArgumentTypeError(
            f"unknown policy {', '.join(bad)}; choose from {', '.join(POLICY_NAMES)}"
        )
    if "default" not in names:
        names = ("default", *names)  # the production default is always reported
    return names


def _fail(message: str) -> int:
    sys.stderr.write(f"quantdrift: error: {message}\n")
    return 2


def run(args: argparse.Namespace) -> int:
    from quantdrift.breaker.policy import load_policy
    from quantdrift.cli.common import load_settings
    from quantdrift.evaluation import ScoreCache, standard_policies
    from quantdrift.evaluation.modes import select as pick
    from quantdrift.evaluation.modes import strip
    from quantdrift.services.pairs import read_pairs
    from quantdrift.services.scoring import build_embedder

    for path in (args.healthy, args.drifted, args.calibrate, args.policy):
        if path is not None and not path.exists():
            return _fail(f"no such file: {path}")
    if args.pair_interval <= 0:
        return _fail(f"--pair-interval-s must be > 0, got {args.pair_interval}")
    policy = load_policy(args.policy)
    policies = {k: v for k, v in standard_policies(policy).items() if k in args.policies}
    part = "evaluation" if args.holdout else None

    def load(path: Path | None, labels: tuple[str, ...] | None, part_: str | None) -> list:  # type: ignore[type-arg]
        if path is None:
            return []
        pairs = pick(read_pairs(path), labels=labels, decoding=args.decoding, part=part_)  # type: ignore[arg-type]
        return [strip(p, args.logprobs) for p in pairs]

    healthy = load(args.healthy, args.healthy_label, part)
    drifted = load(args.drifted, args.drifted_label, part)
    cal_part = "calibration" if args.holdout else None
    calibrate = load(args.calibrate, None, cal_part)
    if not healthy:
        return _fail(f"{args.healthy}: no pairs (after --healthy-label / --decoding / --holdout)")
    embedder, tier = build_embedder(load_settings().embedding, args.embedder)
    from quantdrift.cli.progress import self_closing

    cache = ScoreCache(embedder, progress=self_closing(not args.no_progress, "score pairs"))
    if args.streams is not None:
        return _run_long(args, healthy, drifted, calibrate, cache, policies, tier)
    from quantdrift.evaluation import build_plan, evaluate, format_table

    plan = build_plan(
        healthy, drifted, calibrate, repeat=args.repeat, noise_as_shadow=args.noise_as_shadow
    )
    if not plan.streams:
        return _fail(f"{args.healthy}: no shadow pairs to judge (try --noise-as-shadow)")
    results = evaluate(plan, cache, policies, pair_interval_s=args.pair_interval)
    for note in plan.notes:
        sys.stderr.write(f"eval: {note}\n")
    if args.json:
        print(json.dumps([r.as_dict() for r in results]))
    else:
        print(format_table(results))
        rate = cache.pairs_per_s
        print(
            f"scoring: {cache.scored} pairs once, "
            f"{'-' if rate is None else f'{rate:.0f}'} pairs/s ({tier})"
        )
    return 0


def _run_long(args, healthy, drifted, calibrate, cache, policies, tier) -> int:  # type: ignore[no-untyped-def]
    from quantdrift.evaluation.calibration import floor_seed
    from quantdrift.evaluation.long import ROUTE, format_long, run_long

    floor_pairs = [p for p in [*calibrate, *healthy, *drifted] if p.kind == "noise"]
    blessed = [
        p
        for p in calibrate
        if p.kind == "shadow"
        and args.blessed_label is not None
        and (p.label in args.blessed_label or p.candidate.precision in args.blessed_label)
    ]
    cache.fill([*floor_pairs, *blessed])
    rp = policies["default"].for_route(ROUTE)
    from quantdrift.evaluation import to_score

    seed_rows, source = floor_seed(
        [to_score(p, cache[p], rp, ROUTE) for p in floor_pairs],
        rp.min_noise_pairs,
        [to_score(p, cache[p], rp, ROUTE) for p in blessed],
    )
    shadow_h = [p for p in healthy if p.kind == "shadow"]
    shadow_d = [p for p in drifted if p.kind == "shadow"]
    if not shadow_h:
        return _fail("no healthy shadow pairs to resample")
    # Several --drifted-label values: one drifted pool (and one row per policy) each.
    labels = args.drifted_label or ("drifted",)
    pools = {
        label: [p for p in shadow_d if p.label == label or p.candidate.precision == label]
        for label in labels
    }
    if len(labels) == 1:
        pools = {labels[0]: shadow_d}
    results = run_long(
        shadow_h,
        pools,
        seed_rows,
        cache,
        policies,
        streams=args.streams,
        length=args.length,
        seed=args.seed,
        drift_length=args.drift_length,
        pair_interval_s=args.pair_interval,
        floor_source=source,
    )
    context: dict[str, object] = {
        "embedder": tier,
        "decoding": args.decoding,
        "logprobs": args.logprobs,
        "holdout": args.holdout,
        "distinct_healthy": len(shadow_h),
        "distinct_drifted": {k: len(v) for k, v in pools.items()},
    }
    if args.json:
        print(json.dumps([{**r.as_dict(), **context} for r in results]))
    else:
        print(format_long(results))
        print(
            f"{len(shadow_h)} distinct healthy / {len(shadow_d)} drifted pairs; "
            f"scoring: {cache.scored} pairs once ({tier}); floors: {source}"
        )
    return 0
