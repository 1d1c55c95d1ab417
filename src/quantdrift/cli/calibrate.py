"""``quantdrift calibrate (PAIRS.jsonl[.gz] | --topic [T] RANGE) [--route R] [--redis-url URL]``.

Seeds the noise floor in Redis, per route and decoding mode, from ``noise`` pairs
(reference vs reference): they are scored like the worker scores them, and each
mode's floor is written with the breaker store's compare-and-set
(``BreakerStore.seed_floor``, which ``quantdrift eval`` calls on its in-memory store;
the keys the worker reads, ``{prefix}route:{ROUTE}:noise:MODE``).

The pairs come from a file, or with ``--topic`` from the live pairs topic (another
topic by name), bounded like ``quantdrift replay`` bounds it: ``--since`` /
``--until`` and/or ``--from-offset`` / ``--to-offset``, read by replay's group-less
consumer (nothing committed). Without ``--route`` each route calibrates from its own
noise pairs. With ``--route R`` (repeatable) a topic's pairs are filtered to R's own,
while all of a file's noise pairs calibrate R, e.g. the lab's ``lab/noise`` pairs for
a gateway's ``cs-agent/int4``. Each mode's floor
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
import sys

from quantdrift.cli.common import parse_time
from quantdrift.cli.progress import self_closing
from quantdrift.cli.settings import load_settings, with_stack
from quantdrift.replay.sources import TopicRange
from quantdrift.services.calibration import CalibrationRequest, calibrate


def run(args: argparse.Namespace) -> int:
    ranged = [
        f
        for f in ("since", "until", "from_offset", "to_offset", "partition")
        if getattr(args, f) is not None
    ]
    if args.pairs is None and args.topic is None:
        raise SystemExit("quantdrift: error: calibrate: give a pairs file, or --topic to read one")
    if args.pairs is not None and args.topic is not None:
        raise SystemExit("quantdrift: error: calibrate: give a pairs file or --topic, not both")
    if args.topic is None and ranged:
        flags = ", ".join("--" + f.replace("_", "-") for f in ranged)
        raise SystemExit(f"quantdrift: error: calibrate: {flags} bound a topic; add --topic")
    settings = with_stack(load_settings())
    topic_range = None
    if args.topic is not None:
        topic_range = TopicRange(
            args.from_offset,
            args.to_offset,
            parse_time(args.since),
            parse_time(args.until),
            tuple(args.partition) if args.partition else None,
        )
    request = CalibrationRequest(
        pairs=args.pairs,
        topic=args.topic,
        range=topic_range,
        timeout=args.timeout,
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
        warn=_warn,
    )
    if args.json:
        print(json.dumps(rows))
        return 0
    for row in rows:
        print(
            f"{row['route']} {row['mode']}: {row['seeded']} pairs "
            f"({row['source']}), floor now {row['floor_pairs']}, sha256 {row['sha256']}"
        )
    return 0


def _warn(line: str) -> None:
    sys.stderr.write(f"quantdrift: warning: {line}\n")
