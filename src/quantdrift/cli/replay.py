"""``quantdrift replay``: re-score a topic range, an archive or a JSONL file under a policy.

No side effects: its own group-less consumer (never commits), an in-memory
breaker, no commands, no alerts. It scores as the worker does (the same scorer
factory and settings), so by default it reproduces the worker's decisions;
the orchestration lives in :mod:`quantdrift.services.replay`. Writes
``report.html``, ``scores.csv`` and ``scores.parquet`` (with pyarrow) to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from quantdrift.cli.common import add_seconds, load_settings, parse_time, with_stack
from quantdrift.cli.progress import progress_bar


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("replay")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--topic", nargs="?", const="", help="a topic (default: the pairs topic)")
    src.add_argument("--archive", type=Path, help="an archive directory (quantdrift archive)")
    src.add_argument("--input", type=Path, action="append", help="JSONL(.gz) of pairs or scores")
    p.add_argument("--archive-topic", help="topic inside the archive (default: the pairs topic)")
    p.add_argument("--since", help="start: 1h (ago), ISO time or epoch seconds")
    p.add_argument("--until", help="end (exclusive), same forms as --since")
    p.add_argument("--from-offset", type=int, help="first offset per partition (topic)")
    p.add_argument("--to-offset", type=int, help="stop before this offset per partition")
    p.add_argument("--partition", type=int, action="append", help="only these partitions")
    p.add_argument("--policy", type=Path, help="policy YAML (default: settings' policy_file)")
    p.add_argument(
        "--embedder",
        choices=["none", "static", "tiered", "minilm"],
        default=None,
        help="semantic scorer; default: the worker's (settings embedding.tier)",
    )
    p.add_argument("--out", type=Path, default=Path("replay-report"), help="output directory")
    p.add_argument("--no-parquet", action="store_true", help="skip scores.parquet")
    p.add_argument("--batch", type=int, default=64, help="pairs per embedder call")
    p.add_argument("--worst", type=int, default=10, help="worst pairs listed per route")
    add_seconds(p, "timeout", 120.0, "topic read deadline in seconds")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # Deferred: the replay service loads aiokafka, which `quantdrift --help` never needs.
    from quantdrift.services.replay import ReplayRequest, run_replay

    settings = with_stack(load_settings())
    since, until = parse_time(args.since), parse_time(args.until)
    if args.batch < 1:
        raise SystemExit("quantdrift: error: --batch must be >= 1")
    request = ReplayRequest(
        inputs=tuple(args.input or ()),
        archive=args.archive,
        archive_topic=args.archive_topic,
        topic=args.topic,
        since=since,
        until=until,
        from_offset=args.from_offset,
        to_offset=args.to_offset,
        partitions=tuple(args.partition) if args.partition else None,
        policy=args.policy,
        embedder=args.embedder,
        out=args.out,
        parquet=not args.no_parquet,
        batch=args.batch,
        worst=args.worst,
        timeout=args.timeout,
    )
    with progress_bar(not args.no_progress, "replay") as progress:
        outcome = run_replay(settings, request, progress)
    if outcome.parquet_missing:
        sys.stderr.write(f"quantdrift: scores.parquet {outcome.parquet_note}\n")
    report = outcome.report
    if args.json:
        print(json.dumps(outcome.summary(args.out)))
    else:
        print(f"replayed {len(outcome.scores)} scores from {outcome.source}")
        for route, r in sorted(report.routes.items()):
            trips = ", ".join(f"#{t.index} {t.rule}->{t.to_state}" for t in r.trips) or "none"
            print(
                f"  {route}: {r.shadow_pairs} shadow, {r.noise_pairs} noise; "
                f"transitions: {trips}; false rollbacks: {r.false_rollbacks}"
            )
        if outcome.skipped:
            print(f"  skipped {outcome.skipped} unreadable records")
        print(f"report: {args.out / 'report.html'}; scores: {args.out / 'scores.csv'}")
        print(f"parquet: {outcome.parquet_note}")
    return 0
