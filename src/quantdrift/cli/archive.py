"""``quantdrift archive``: pairs and scores to rotating, gzipped, date-partitioned JSONL.

Files: ``DIR/topic=<topic>/date=YYYY-MM-DD/part-N.jsonl.gz``; its own consumer
group commits after each flush, so a restart resumes where the files end.
``quantdrift replay --archive DIR`` reads them back.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path

from quantdrift.cli.common import (
    add_consumer_options,
    add_seconds,
    consumer_loop_options,
    load_settings,
    with_stack,
)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("archive")
    p.add_argument("--dir", type=Path, required=True, help="archive root directory")
    p.add_argument("--topic", action="append", help="topics (default: the pairs and scores)")
    p.add_argument("--rotate-mb", type=float, default=64.0, help="rotate a file at this size")
    p.add_argument("--rotate-records", type=int, default=100_000, help="or at this many records")
    add_seconds(p, "flush-interval", 60.0, "flush and commit every N seconds")
    add_consumer_options(p, "archive", "records")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from quantdrift.kafka_clients import consumer_kwargs
    from quantdrift.replay.archive import ArchiveWriter, run_archive

    settings = with_stack(load_settings())
    if args.rotate_mb <= 0 or args.rotate_records < 1:
        raise SystemExit("quantdrift: error: --rotate-mb and --rotate-records must be > 0")
    topics = args.topic or [settings.kafka.topics.pairs, settings.kafka.topics.scores]
    writer = ArchiveWriter(
        args.dir, max_bytes=int(args.rotate_mb * 1024 * 1024), max_records=args.rotate_records
    )
    stats = asyncio.run(
        run_archive(
            consumer_kwargs(settings.kafka),
            topics,
            writer,
            flush_interval_s=args.flush_interval,
            **consumer_loop_options(args, settings),
        )
    )
    print(
        json.dumps(
            {
                "records": stats.records,
                "skipped": stats.skipped,
                "commits": stats.commits,
                "files": [str(f) for f in stats.files],
            }
        )
    )
    return 0
