"""``quantdrift replay``: re-score a topic range, an archive or a JSONL file under a policy.

No side effects: its own group-less consumer (never commits), an in-memory
breaker, no commands, no alerts. Writes ``report.html``, ``scores.csv`` and
``scores.parquet`` (with pyarrow) to ``--out``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from quantdrift.cli.common import load_settings, parse_time, with_stack


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("replay", help="re-score pairs under a policy, no side effects; report")
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
    p.add_argument("--embedder", choices=["none", "minilm"], default="minilm")
    p.add_argument("--out", type=Path, default=Path("replay-report"), help="output directory")
    p.add_argument("--no-parquet", action="store_true", help="skip scores.parquet")
    p.add_argument("--batch", type=int, default=64, help="pairs per embedder call")
    p.add_argument("--worst", type=int, default=10, help="worst pairs listed per route")
    p.add_argument("--timeout", type=float, default=120.0, help="topic read deadline (s)")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(func=run)


@contextmanager
def _progress(enabled: bool) -> Iterator[Any]:
    """A rich progress bar on stderr; a no-op callable when disabled or not a terminal."""
    if not enabled or not sys.stderr.isatty():

        def noop(**_: Any) -> None:
            return None

        yield noop
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

    with Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        console=Console(stderr=True),
        transient=True,
    ) as bar:
        tasks: dict[str, Any] = {}

        def update(*, desc: str = "replay", total: int | None = None, advance: int = 0) -> None:
            if desc not in tasks:
                tasks[desc] = bar.add_task(desc, total=total)
            elif total is not None:
                bar.update(tasks[desc], total=total)
            if advance:
                bar.advance(tasks[desc], advance)

        yield update


def run(args: argparse.Namespace) -> int:
    from quantdrift.breaker.policy import load_policy
    from quantdrift.detectors import verdict
    from quantdrift.replay import build_report, render, rescore_stream, score_rows
    from quantdrift.replay import sources as src

    settings = with_stack(load_settings())
    policy = load_policy(args.policy or settings.policy_file)
    since, until = parse_time(args.since), parse_time(args.until)
    if args.batch < 1:
        raise SystemExit("quantdrift: error: --batch must be >= 1")
    with _progress(not args.no_progress) as progress:
        if args.input:
            lines: list[bytes] = [ln for path in args.input for ln in src.file_lines(path)]
            source = ", ".join(map(str, args.input))
        elif args.archive:
            topic = args.archive_topic or settings.kafka.topics.pairs
            lines = list(src.archive_lines(args.archive, topic, since, until))
            source = f"archive {args.archive} topic={topic}"
        else:
            from quantdrift.kafka_settings import consumer_kwargs

            topic = args.topic or settings.kafka.topics.pairs
            rng = src.TopicRange(
                args.from_offset,
                args.to_offset,
                since,
                until,
                tuple(args.partition) if args.partition else None,
            )

            def read_progress(total: int | None = None, advance: int = 0) -> None:
                progress(desc="read topic", total=total, advance=advance)

            lines = asyncio.run(
                src.topic_values(
                    consumer_kwargs(settings.kafka),
                    topic,
                    rng,
                    timeout=args.timeout,
                    progress=read_progress,
                )
            )
            source = f"topic {topic} @ {settings.kafka.bootstrap_servers}"
        records = src.split_records(lines, since, until)
        embedder = None
        if args.embedder == "minilm" and records.pairs:
            from quantdrift.embedding import SentenceTransformerEmbedder

            e = settings.embedding
            embedder = SentenceTransformerEmbedder(
                model=e.model if e.model != "none" else "packaged:all-MiniLM-L6-v2",
                batch_size=e.batch_size,
                threads=e.threads,
                cache_size=e.cache_size,
            )
        progress(desc="score", total=len(records.pairs))
        scores = rescore_stream(
            records.pairs,
            embedder,
            policy,
            batch=args.batch,
            progress=lambda n: progress(desc="score", advance=n),
        )
    # Recorded scores are re-judged: the verdict follows this policy's thresholds.
    for s in records.scores:
        v, reasons = verdict(s.metrics, policy.thresholds(s.route))
        scores.append(s.model_copy(update={"verdict": v, "reasons": reasons}))
    report = build_report(scores, policy, worst_n=args.worst, source=source)
    args.out.mkdir(parents=True, exist_ok=True)
    rows = score_rows(scores)
    (args.out / "report.html").write_text(render.render_html(report), encoding="utf-8")
    render.write_csv(rows, args.out / "scores.csv")
    parquet_note = "skipped (--no-parquet)"
    if not args.no_parquet:
        if render.parquet_available():
            render.write_parquet(rows, args.out / "scores.parquet")
            parquet_note = str(args.out / "scores.parquet")
        else:
            parquet_note = (
                "NOT written: pyarrow is not installed (pip install 'quantdrift[report]')"
            )
            sys.stderr.write(f"quantdrift: scores.parquet {parquet_note}\n")
    summary = {
        "source": source,
        "pairs_rescored": len(records.pairs),
        "scores_rejudged": len(records.scores),
        "skipped": len(records.skipped),
        "out": str(args.out),
        "parquet": parquet_note,
        "routes": {
            route: {
                "shadow_pairs": r.shadow_pairs,
                "noise_pairs": r.noise_pairs,
                "false_rollbacks": r.false_rollbacks,
                "trips": [
                    {"index": t.index, "pair_id": t.pair_id, "rule": t.rule, "to": t.to_state}
                    for t in r.trips
                ],
            }
            for route, r in report.routes.items()
        },
    }
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print(f"replayed {len(scores)} scores from {source}")
        for route, r in sorted(report.routes.items()):
            trips = ", ".join(f"#{t.index} {t.rule}->{t.to_state}" for t in r.trips) or "none"
            print(
                f"  {route}: {r.shadow_pairs} shadow, {r.noise_pairs} noise; "
                f"transitions: {trips}; false rollbacks: {r.false_rollbacks}"
            )
        if records.skipped:
            print(f"  skipped {len(records.skipped)} unreadable records")
        print(f"report: {args.out / 'report.html'}; scores: {args.out / 'scores.csv'}")
        print(f"parquet: {parquet_note}")
    return 0
