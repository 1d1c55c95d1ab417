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

from quantdrift.cli.common import parse_time
from quantdrift.cli.progress import progress_bar
from quantdrift.cli.settings import load_settings, with_stack
from quantdrift.services.replay import ReplayRequest, run_replay


def run(args: argparse.Namespace) -> int:
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
