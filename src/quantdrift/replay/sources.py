"""Where replayed records come from: JSONL(.gz) files, an archive directory, a topic range.

Every source yields raw JSON lines/values; :func:`split_records` turns them
into pairs (to re-score) and scores (already scored: only re-judged).

The topic reader is its own consumer with ``group_id=None``: it never joins
the workers' group and never commits, so a replay cannot move anyone's
offsets. Tansu answers a timestamp lookup (ListOffsets) with offset 0, so a
time range is sought *and* filtered on each record's timestamp.
"""

from __future__ import annotations

import gzip
import re
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, TopicPartition

from quantdrift.errors import ConfigError, InputError, SchemaError
from quantdrift.kafka_clients import start_client
from quantdrift.schemas import PairEvent, ScoreEvent, unverified_score

_PART = re.compile(r"part-(\d+)\.jsonl(\.gz)?$")


@dataclass
class Records:
    pairs: list[PairEvent]
    scores: list[ScoreEvent]
    skipped: list[str]


def split_records(
    lines: Iterable[bytes], since: float | None = None, until: float | None = None
) -> Records:
    """Parse JSON lines into pairs and scores (by shape); unreadable ones are counted."""
    out = Records([], [], [])
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            data = orjson.loads(line)
            if not isinstance(data, dict):
                raise SchemaError("not a JSON object")
            # A score carries metrics (or is a signed score's envelope); else a pair.
            is_score = "metrics" in data or "payload" in data
            record: PairEvent | ScoreEvent = (
                unverified_score(data) if is_score else PairEvent.parse(data)
            )
        except (orjson.JSONDecodeError, SchemaError) as exc:
            out.skipped.append(f"record {n}: {exc}")
            continue
        if since is not None and record.ts < since:
            continue
        if until is not None and record.ts >= until:
            continue
        if isinstance(record, ScoreEvent):
            out.scores.append(record)
        else:
            out.pairs.append(record)
    return out


def file_lines(path: Path) -> Iterator[bytes]:
    """Lines of a JSONL or JSONL.gz file."""
    try:
        raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    except FileNotFoundError as exc:
        raise ConfigError(f"replay input not found: {path}") from exc
    except (OSError, EOFError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from exc
    yield from raw.splitlines()


def archive_files(root: Path, topic: str) -> list[Path]:
    """``root/topic=T/date=D/part-N.jsonl.gz`` in date, then part, order."""
    base = root / f"topic={topic}"
    if not base.is_dir():
        raise ConfigError(f"no archive for topic {topic!r} under {root}")
    files: list[Path] = []
    for day in sorted(p for p in base.iterdir() if p.is_dir() and p.name.startswith("date=")):
        parts = [(int(m.group(1)), p) for p in day.iterdir() if (m := _PART.match(p.name))]
        files.extend(p for _, p in sorted(parts))
    return files


def archive_lines(
    root: Path, topic: str, since: float | None = None, until: float | None = None
) -> Iterator[bytes]:
    """Lines of an archive, skipping whole date partitions outside [since, until)."""
    for path in archive_files(root, topic):
        day = path.parent.name.removeprefix("date=")
        try:
            start = time.mktime(time.strptime(day, "%Y-%m-%d")) - time.timezone
        except ValueError:
            start = None
        if start is not None:
            # Partitions are UTC days; a whole day outside the range is not even opened.
            if since is not None and start + 86400 <= since:
                continue
            if until is not None and start >= until:
                continue
        yield from file_lines(path)


@dataclass(frozen=True, slots=True)
class TopicRange:
    """Which records of a topic: offsets [start, stop) per partition, and/or a time range.

    A range that can hold nothing is refused when it is made, so no command reads a
    topic to the end only to say it found nothing:

    >>> TopicRange(start_offset=20, stop_offset=10)
    Traceback (most recent call last):
    ...
    quantdrift.errors.InputError: empty offset range: --from-offset 20 is not below --to-offset 10
    """

    start_offset: int | None = None
    stop_offset: int | None = None
    since: float | None = None  # seconds since the epoch
    until: float | None = None
    partitions: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        for flag, offset in (
            ("--from-offset", self.start_offset),
            ("--to-offset", self.stop_offset),
        ):
            if offset is not None and offset < 0:
                raise InputError(f"{flag} must be >= 0, got {offset}")
        if (
            self.start_offset is not None
            and self.stop_offset is not None
            and self.start_offset >= self.stop_offset
        ):
            raise InputError(
                f"empty offset range: --from-offset {self.start_offset} is not below "
                f"--to-offset {self.stop_offset}"
            )
        if self.since is not None and self.until is not None and self.since >= self.until:
            raise InputError(
                f"empty time range: --since {_iso(self.since)} is not before "
                f"--until {_iso(self.until)}"
            )
        if self.partitions is not None and any(p < 0 for p in self.partitions):
            raise InputError(f"--partition must be >= 0, got {list(self.partitions)}")

    def describe(self) -> str:
        """The range in the flags' words, for a message that says what was read."""
        parts = []
        if self.start_offset is not None or self.stop_offset is not None:
            lo = "" if self.start_offset is None else self.start_offset
            hi = "" if self.stop_offset is None else self.stop_offset
            parts.append(f"offsets [{lo}, {hi})")
        if self.since is not None or self.until is not None:
            lo = "" if self.since is None else _iso(self.since)
            hi = "" if self.until is None else _iso(self.until)
            parts.append(f"time [{lo}, {hi})")
        if self.partitions is not None:
            parts.append("partitions " + ",".join(map(str, self.partitions)))
        return ", ".join(parts) or "the whole topic"


def _iso(ts: float) -> str:
    """Epoch seconds as UTC ISO 8601, to the second.

    >>> _iso(1700000000.4)
    '2023-11-14T22:13:20Z'
    """
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


async def topic_values(
    consumer_options: dict[str, Any],
    topic: str,
    rng: TopicRange,
    *,
    timeout: float = 60.0,
    progress: Any = None,
) -> list[bytes]:
    """Values of ``topic`` in ``rng``, up to the end offsets seen at the start.

    Records are returned partition by partition in offset order: a route lives
    in one partition, so each route keeps its order (the breaker is per route).
    """
    # No group: nothing is committed, so a replay leaves every consumer group as it was.
    options = dict(
        consumer_options, group_id=None, enable_auto_commit=False, auto_offset_reset="earliest"
    )
    consumer = AIOKafkaConsumer(**options)
    await start_client(consumer, str(consumer_options.get("bootstrap_servers")))
    got: list[tuple[int, int, int, bytes]] = []
    try:
        await consumer.topics()
        parts = consumer.partitions_for_topic(topic)
        if not parts:
            raise ConfigError(f"topic {topic!r} not found")
        wanted = sorted(parts if rng.partitions is None else set(parts) & set(rng.partitions))
        if not wanted:
            raise InputError(
                f"topic {topic!r} has no partition {', '.join(map(str, rng.partitions or ()))} "
                f"(it has {', '.join(map(str, sorted(parts)))})"
            )
        tps = [TopicPartition(topic, p) for p in wanted]
        consumer.assign(tps)
        begins = await consumer.beginning_offsets(tps)
        starts = {tp: begins[tp] for tp in tps}
        if rng.start_offset is not None:
            starts = {tp: max(begins[tp], rng.start_offset) for tp in tps}
        elif rng.since is not None:
            found = await consumer.offsets_for_times({tp: int(rng.since * 1000) for tp in tps})
            for tp in tps:
                hit = found.get(tp)
                if hit is not None:
                    starts[tp] = hit.offset
        for tp in tps:
            consumer.seek(tp, starts[tp])
        # The end is the high watermark of the first fetch, not ListOffsets(latest):
        # Tansu answers that with the last batch's base offset + 1.
        stops: dict[Any, int] = {}
        todo = set(tps)
        deadline = time.monotonic() + timeout
        since_ms = None if rng.since is None else rng.since * 1000
        until_ms = None if rng.until is None else rng.until * 1000
        while todo and time.monotonic() < deadline:
            batches = await consumer.getmany(*todo, timeout_ms=500)
            for tp in list(todo):
                if tp not in stops and (hw := consumer.highwater(tp)) is not None:
                    stops[tp] = hw if rng.stop_offset is None else min(hw, rng.stop_offset)
                    if progress is not None:
                        progress(total=sum(max(0, stops[t] - starts[t]) for t in stops))
            for tp, records in batches.items():
                for r in records:
                    if tp in stops and r.offset >= stops[tp]:
                        break
                    if progress is not None:
                        progress(advance=1)
                    if r.value is None:
                        continue
                    if since_ms is not None and r.timestamp < since_ms:
                        continue
                    if until_ms is not None and r.timestamp >= until_ms:
                        continue
                    got.append((r.timestamp, tp.partition, r.offset, r.value))
            for tp in list(todo):
                if tp in stops and await consumer.position(tp) >= stops[tp]:
                    todo.discard(tp)
        if todo:
            raise ConfigError(
                f"reading {topic!r} timed out after {timeout:g}s with "
                f"{len(todo)} partition(s) unread"
            )
    finally:
        await consumer.stop()
    got.sort(key=lambda g: (g[1], g[2]))
    return [g[3] for g in got]
