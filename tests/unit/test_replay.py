"""Replay's report against a known synthetic stream: numbers checked, not just rendered."""

from __future__ import annotations

import asyncio
import csv
import gzip
import itertools
import re
from pathlib import Path

import pytest

from quantdrift.breaker import Policy, RoutePolicy, StreamFold, offline_store
from quantdrift.demo import synthetic
from quantdrift.replay import build_report, quantiles, render, rescore_stream, score_rows
from quantdrift.replay.archive import ArchiveWriter, record_line
from quantdrift.replay.sources import archive_files, archive_lines, split_records

ROUTE = "cs-agent/int4"
# Without an embedder the window rule would compare ROUGE-L (~0.6 on paraphrases) with a
# cosine-scale 0.85 and trip on healthy traffic; replay shows exactly that (see below).
NO_WINDOW = Policy(default=RoutePolicy(rules=("consecutive", "sequential")))


def healthy_then_drifted(n_healthy: int = 60, n_drifted: int = 12):  # type: ignore[no-untyped-def]
    return list(itertools.islice(synthetic.healthy(ROUTE), n_healthy)) + list(
        itertools.islice(synthetic.drifted(ROUTE), n_drifted)
    )


def direct_trips(scores, policy):  # type: ignore[no-untyped-def]
    fold = StreamFold(offline_store(), policy)
    return asyncio.run(fold.fold_all((s.ts, s) for s in scores))


def test_trip_index_matches_the_offline_fold_and_no_false_rollback_on_healthy() -> None:
    pairs = healthy_then_drifted()
    scores = rescore_stream(pairs, None, NO_WINDOW, batch=16)
    report = build_report(scores, NO_WINDOW)
    rep = report.routes[ROUTE]
    assert rep.shadow_pairs == sum(p.kind == "shadow" for p in pairs) == 57
    assert rep.noise_pairs == 15
    direct = direct_trips(scores, NO_WINDOW)
    assert [(t.index, t.pair_id, t.transition.rule) for t in direct] == [
        (t.index, t.pair_id, t.rule) for t in rep.trips
    ]
    # The drifted stream starts at shadow pair 46; K=3 failing pairs trip on the 48th.
    assert [(t.index, t.rule, t.to_state) for t in rep.trips] == [(48, "consecutive", "open")]
    assert rep.trips[0].pair_id.startswith("demo-drifted-")
    assert rep.false_rollbacks == 0 and rep.labelled_rollbacks == 1
    assert rep.rule_fires == {"consecutive": [48]}


def test_healthy_only_never_trips() -> None:
    pairs = list(itertools.islice(synthetic.healthy(ROUTE), 120))
    report = build_report(rescore_stream(pairs, None, NO_WINDOW), NO_WINDOW)
    assert report.trips == []
    assert report.routes[ROUTE].false_rollbacks == 0


def test_false_rollback_is_flagged_when_the_recent_pairs_are_healthy() -> None:
    """A window bar set too high trips on healthy pairs: replay must say so."""
    pairs = list(itertools.islice(synthetic.healthy(ROUTE), 60))
    policy = Policy(default=RoutePolicy(rules=("window",), window_mean_lexical=0.9))
    report = build_report(rescore_stream(pairs, None, policy), policy)
    rep = report.routes[ROUTE]
    assert [(t.index, t.rule) for t in rep.trips] == [(20, "window")]
    assert [t.index for t in direct_trips(rescore_stream(pairs, None, policy), policy)] == [20]
    assert rep.trips[0].false_rollback is True
    assert rep.false_rollbacks == 1


def test_quantiles_and_noise_floor_distributions() -> None:
    assert quantiles([]) is None
    assert quantiles([3.0, 1.0, 2.0], (0.0, 0.5, 1.0)) == [1.0, 2.0, 3.0]
    pairs = healthy_then_drifted()
    scores = rescore_stream(pairs, None, NO_WINDOW)
    rep = build_report(scores, NO_WINDOW).routes[ROUTE]
    noise = [s.metrics.rougeL for s in scores if s.kind == "noise"]
    assert rep.quantiles["rougeL"]["noise"] == quantiles(noise)
    assert rep.quantiles["rougeL"]["shadow"][0] < rep.quantiles["rougeL"]["noise"][0]
    assert rep.worst[0]["verdict"] != "ok"
    assert all(w["label"] == "drifted" for w in rep.worst[:5])


def test_outputs_csv_rows_equal_pairs_and_html_carries_the_numbers(tmp_path: Path) -> None:
    pairs = healthy_then_drifted()
    scores = rescore_stream(pairs, None, NO_WINDOW)
    report = build_report(scores, NO_WINDOW, source="unit")
    rows = score_rows(scores)
    render.write_csv(rows, tmp_path / "scores.csv")
    with (tmp_path / "scores.csv").open() as fh:
        read = list(csv.DictReader(fh))
    assert len(read) == len(pairs)
    assert [r["pair_id"] for r in read] == [p.pair_id for p in pairs]
    page = render.render_html(report)
    assert page.startswith("<!doctype html>") and "<script" not in page
    assert 'src="http' not in page and "href=" not in page  # self-contained
    assert re.findall(r'class="trip" data-trip="(\d+)"', page) == ["48"]
    assert "class='false-rollbacks'>0<" in page
    assert page.count('class="hist"') >= 4


def test_parquet_round_trip(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow.parquet", reason="pyarrow (extra 'report') not installed")
    scores = rescore_stream(healthy_then_drifted(20, 4), None, NO_WINDOW)
    render.write_parquet(score_rows(scores), tmp_path / "s.parquet")
    table = pa.read_table(tmp_path / "s.parquet")
    assert table.num_rows == len(scores)
    assert table.column("pair_id").to_pylist() == [s.pair_id for s in scores]


def test_archive_writer_rotates_partitions_and_reads_back(tmp_path: Path) -> None:
    pairs = healthy_then_drifted(30, 5)
    writer = ArchiveWriter(tmp_path, max_records=10)
    day = 86400.0 * 20_000  # 2024-10-04
    for i, p in enumerate(pairs):
        moved = p.model_copy(update={"ts": day + i * 3000.0})  # crosses into the next day
        line = record_line(moved.dumps(), 0)
        assert line is not None
        writer.write("pairs.v1", *line)
    writer.close_all()
    files = archive_files(tmp_path, "pairs.v1")
    assert files[0].parent.name == "date=2024-10-04"
    assert {f.parent.name for f in files} == {"date=2024-10-04", "date=2024-10-05"}
    assert all(re.fullmatch(r"part-\d+\.jsonl\.gz", f.name) for f in files)
    assert not list(tmp_path.rglob("*.tmp"))
    assert all(len(gzip.decompress(f.read_bytes()).splitlines()) <= 10 for f in files)
    back = split_records(archive_lines(tmp_path, "pairs.v1"))
    assert [p.pair_id for p in back.pairs] == [p.pair_id for p in pairs]
    # a time range skips whole days and filters inside one
    later = split_records(archive_lines(tmp_path, "pairs.v1", since=day + 86400.0))
    assert later.pairs and all(p.ts >= day + 86400.0 for p in later.pairs)


def test_split_records_tells_pairs_from_scores_and_counts_bad_lines() -> None:
    pairs = healthy_then_drifted(3, 0)
    scores = rescore_stream(pairs, None, NO_WINDOW)
    lines = [pairs[0].dumps(), scores[1].dumps(), b"{not json", b"[1]", b""]
    got = split_records(lines)
    assert len(got.pairs) == 1 and len(got.scores) == 1 and len(got.skipped) == 2
