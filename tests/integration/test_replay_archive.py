"""Replay from a real topic (offsets, time range) and the archive sink, on embedded Tansu."""

from __future__ import annotations

import asyncio
import itertools
import json
from pathlib import Path

import pytest

from quantdrift.cli import main
from quantdrift.config import KafkaSettings
from quantdrift.demo import synthetic
from quantdrift.kafka_clients import consumer_kwargs
from quantdrift.replay.archive import ArchiveWriter, run_archive
from quantdrift.replay.sources import TopicRange, archive_files, split_records, topic_values
from support.kafka import unique_topic

ROUTE = "cs-agent/int4"


async def _produce(bootstrap: str, topic: str, items: list[tuple[bytes, bytes, int]]) -> None:
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    await producer.start()
    try:
        futs = [
            await producer.send(topic, value, key=key, timestamp_ms=ts, partition=0)
            for key, value, ts in items
        ]
        await asyncio.gather(*futs)
    finally:
        await producer.stop()


@pytest.fixture
def pairs_topic(stack):  # type: ignore[no-untyped-def]
    """60 healthy + 12 drifted pairs on one partition; the second half an hour later."""
    topic = unique_topic("replay")
    pairs = list(itertools.islice(synthetic.healthy(ROUTE), 60)) + list(
        itertools.islice(synthetic.drifted(ROUTE), 12)
    )
    t0 = 1_700_000_000_000
    items = [
        (ROUTE.encode(), p.dumps(), t0 + (0 if i < 36 else 3_600_000) + i)
        for i, p in enumerate(pairs)
    ]
    asyncio.run(_produce(stack.bootstrap, topic, items))
    return topic, pairs, t0


def test_topic_range_by_offsets_and_by_time(stack, pairs_topic) -> None:  # type: ignore[no-untyped-def]
    topic, pairs, t0 = pairs_topic
    options = consumer_kwargs(KafkaSettings(bootstrap_servers=stack.bootstrap))
    everything = asyncio.run(topic_values(options, topic, TopicRange(), timeout=20))
    assert len(everything) == len(pairs)
    window = asyncio.run(
        topic_values(options, topic, TopicRange(start_offset=10, stop_offset=20), timeout=20)
    )
    assert [json.loads(v)["pair_id"] for v in window] == [p.pair_id for p in pairs[10:20]]
    # Tansu seeks a timestamp to offset 0: the record-timestamp filter must still cut.
    later = asyncio.run(
        topic_values(options, topic, TopicRange(since=(t0 + 3_000_000) / 1000), timeout=20)
    )
    assert [json.loads(v)["pair_id"] for v in later] == [p.pair_id for p in pairs[36:]]
    assert len(split_records(later).pairs) == 36


def test_replay_cli_from_topic_has_no_side_effects(
    stack, pairs_topic, tmp_path: Path, monkeypatch, capsys
) -> None:  # type: ignore[no-untyped-def]
    topic, pairs, _ = pairs_topic
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("QUANTDRIFT_KAFKA__BOOTSTRAP_SERVERS", stack.bootstrap)
    policy = tmp_path / "policy.yaml"
    policy.write_text("default:\n  rules: [consecutive, sequential]\n")
    code = main(
        [
            "replay",
            "--topic",
            topic,
            "--embedder",
            "none",
            "--policy",
            str(policy),
            "--out",
            str(tmp_path / "out"),
            "--json",
            "--no-progress",
        ]
    )
    assert code == 0
    summary = json.loads(capsys.readouterr().out)
    route = summary["routes"][ROUTE]
    assert summary["pairs_rescored"] == len(pairs)
    assert route["trips"] == [
        {"index": 48, "pair_id": route["trips"][0]["pair_id"], "rule": "consecutive", "to": "open"}
    ]
    assert route["false_rollbacks"] == 0
    lines = (tmp_path / "out" / "scores.csv").read_text().strip().splitlines()
    assert len(lines) == len(pairs) + 1
    assert (tmp_path / "out" / "report.html").stat().st_size > 5000


def test_archive_sink_commits_and_replay_reads_it(
    stack, pairs_topic, tmp_path: Path, monkeypatch, capsys
) -> None:  # type: ignore[no-untyped-def]
    topic, pairs, _ = pairs_topic
    options = consumer_kwargs(KafkaSettings(bootstrap_servers=stack.bootstrap))
    group = f"{topic}-archive"
    writer = ArchiveWriter(tmp_path / "arch", max_records=25)
    stats = asyncio.run(
        run_archive(options, [topic], writer, group_id=group, max_records=72, idle_exit_s=8)
    )
    assert stats.records == 72 and stats.commits >= 3
    files = archive_files(tmp_path / "arch", topic)
    assert len(files) >= 3  # 25 records a file, and the day partition of each pair's ts
    # Committed: the same group finds nothing left to archive.
    again = asyncio.run(
        run_archive(
            options, [topic], ArchiveWriter(tmp_path / "arch2"), group_id=group, idle_exit_s=3
        )
    )
    assert again.records == 0
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("QUANTDRIFT_KAFKA__BOOTSTRAP_SERVERS", stack.bootstrap)
    code = main(
        [
            "replay",
            "--archive",
            str(tmp_path / "arch"),
            "--archive-topic",
            topic,
            "--embedder",
            "none",
            "--out",
            str(tmp_path / "out"),
            "--json",
            "--no-progress",
            "--no-parquet",
        ]
    )
    assert code == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["pairs_rescored"] == len(pairs)
