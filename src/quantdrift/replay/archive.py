"""The archive sink: topics to rotating, gzip-compressed, date-partitioned JSONL files.

Layout: ``ROOT/topic=<topic>/date=YYYY-MM-DD/part-N.jsonl.gz``, one message
(compact JSON) a line, the date being the message's own ``ts`` in UTC (the
Kafka timestamp when it has none). A file is written as ``.part-N.jsonl.gz.tmp``
and renamed when closed, so a reader never sees half a file, and the consumer
commits its offsets only after every file holding them is closed: a crash
re-archives at most the open files' records (replay dedupes on ``pair_id``).
"""

from __future__ import annotations

import asyncio
import gzip
import logging
import re
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer

from quantdrift.kafka_clients import start_client

log = logging.getLogger("quantdrift.archive")
_PART = re.compile(r"^\.?part-(\d+)\.jsonl\.gz(\.tmp)?$")


def partition_dir(root: Path, topic: str, ts: float) -> Path:
    """Where a record of ``topic`` at ``ts`` goes (UTC day).

    >>> partition_dir(Path("a"), "t.v1", 0.0).as_posix()
    'a/topic=t.v1/date=1970-01-01'
    """
    day = datetime.fromtimestamp(ts, tz=UTC).strftime("%Y-%m-%d")
    return root / f"topic={topic}" / f"date={day}"


@dataclass
class _OpenFile:
    tmp: Path
    final: Path
    fh: gzip.GzipFile
    records: int = 0
    raw_bytes: int = 0


@dataclass
class ArchiveWriter:
    """Append records to per-(topic, date) files; rotate by size or record count."""

    root: Path
    max_bytes: int = 64 * 1024 * 1024
    max_records: int = 100_000
    compresslevel: int = 6
    files: dict[tuple[str, str], _OpenFile] = field(default_factory=dict)
    written: list[Path] = field(default_factory=list)

    def _next_part(self, directory: Path) -> int:
        numbers = [int(m.group(1)) for p in directory.iterdir() if (m := _PART.match(p.name))]
        return max(numbers, default=-1) + 1

    def _open(self, topic: str, ts: float) -> _OpenFile:
        directory = partition_dir(self.root, topic, ts)
        key = (topic, directory.name)
        current = self.files.get(key)
        if current is not None:
            return current
        directory.mkdir(parents=True, exist_ok=True)
        n = self._next_part(directory)
        tmp = directory / f".part-{n}.jsonl.gz.tmp"
        # Held open across writes and closed on rotation, hence no ``with``.
        fh = gzip.GzipFile(tmp, "wb", compresslevel=self.compresslevel)
        opened = _OpenFile(tmp, directory / f"part-{n}.jsonl.gz", fh)
        self.files[key] = opened
        return opened

    def write(self, topic: str, ts: float, line: bytes) -> bool:
        """Append one line; True when that closed (rotated) a file."""
        f = self._open(topic, ts)
        f.fh.write(line.rstrip(b"\n") + b"\n")
        f.records += 1
        f.raw_bytes += len(line) + 1
        if f.records >= self.max_records or f.raw_bytes >= self.max_bytes:
            self._close(f)
            return True
        return False

    def _close(self, f: _OpenFile) -> None:
        f.fh.close()
        f.tmp.rename(f.final)
        self.written.append(f.final)
        self.files = {k: v for k, v in self.files.items() if v is not f}

    def close_all(self) -> None:
        for f in list(self.files.values()):
            self._close(f)


def record_line(value: bytes | None, kafka_ts_ms: int) -> tuple[float, bytes] | None:
    """(event time, compact JSON line) of a record; None for a record that is not JSON."""
    if value is None:
        return None
    try:
        data = orjson.loads(value)
    except orjson.JSONDecodeError:
        return None
    ts = data.get("ts") if isinstance(data, dict) else None
    if not isinstance(ts, int | float) or ts < 0:
        ts = kafka_ts_ms / 1000.0
    return float(ts), orjson.dumps(data)


@dataclass
class ArchiveStats:
    records: int = 0
    skipped: int = 0
    commits: int = 0
    files: list[Path] = field(default_factory=list)


async def run_archive(
    consumer_options: dict[str, Any],
    topics: list[str],
    writer: ArchiveWriter,
    *,
    group_id: str,
    max_records: int | None = None,
    idle_exit_s: float | None = None,
    flush_interval_s: float = 60.0,
) -> ArchiveStats:
    """Consume ``topics`` into ``writer``; commit after every flush of all open files.

    Stops after ``max_records`` records, or after ``idle_exit_s`` seconds
    without a record, or on cancellation (open files are closed and committed).
    """
    stats = ArchiveStats()
    consumer = AIOKafkaConsumer(
        *topics,
        **{
            **consumer_options,
            "group_id": group_id,
            "enable_auto_commit": False,
            "auto_offset_reset": "earliest",
        },
    )
    pending: dict[Any, int] = {}

    async def flush() -> None:
        writer.close_all()
        if pending:
            await consumer.commit(dict(pending))
            stats.commits += 1
            pending.clear()

    await start_client(consumer, str(consumer_options.get("bootstrap_servers")))
    last_record = last_flush = time.monotonic()
    try:
        while True:
            if max_records is not None and stats.records >= max_records:
                break
            if idle_exit_s is not None and time.monotonic() - last_record > idle_exit_s:
                break
            room = 500 if max_records is None else max(1, min(500, max_records - stats.records))
            batches = await consumer.getmany(timeout_ms=500, max_records=room)
            for tp, records in batches.items():
                for r in records:
                    last_record = time.monotonic()
                    line = record_line(r.value, r.timestamp)
                    pending[tp] = r.offset + 1
                    if line is None:
                        stats.skipped += 1
                        continue
                    stats.records += 1
                    if writer.write(tp.topic, line[0], line[1]):
                        # A file closed: close the others too, then commit up to here.
                        await flush()
                        last_flush = time.monotonic()
            if pending and time.monotonic() - last_flush > flush_interval_s:
                await flush()
                last_flush = time.monotonic()
    except asyncio.CancelledError:
        log.info("archive cancelled: closing files")
        raise
    finally:
        try:
            await flush()
        finally:
            await consumer.stop()
    stats.files = list(writer.written)
    return stats
