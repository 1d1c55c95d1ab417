"""``quantdrift archive``: pairs and scores to rotating, gzipped, date-partitioned JSONL.

Files: ``DIR/topic=<topic>/date=YYYY-MM-DD/part-N.jsonl.gz``; its own consumer
group commits after each flush, so a restart resumes where the files end.
``quantdrift replay --archive DIR`` reads them back.
"""

from __future__ import annotations

import argparse
import asyncio
import json

from quantdrift.cli.common import consumer_loop_options
from quantdrift.cli.settings import load_settings, with_stack
from quantdrift.kafka_clients import consumer_kwargs
from quantdrift.replay.archive import ArchiveWriter, run_archive


def run(args: argparse.Namespace) -> int:
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
