"""The report page's charts: each drawn from its check's evidence, and only when it is there."""

from __future__ import annotations

from typing import Any

from quantdrift.preflight import html


def report(*items: tuple[str, dict[str, Any]]) -> dict[str, Any]:
    return {"items": [{"id": cid, "evidence": evidence} for cid, evidence in items]}


def test_evidence_is_none_for_a_missing_check_or_key() -> None:
    r = report(("niah", {"by_length": [1]}))
    assert html._evidence(r, "niah", "by_length") == [1]
    assert html._evidence(r, "niah", "other") is None
    assert html._evidence(r, "load", "latency_series") is None


def test_columns_pair_one_x_with_each_named_column() -> None:
    rows = [{"b": 64, "f": 0.4, "s": 0.1}, {"b": 512, "f": 0.9, "s": 0.3}]
    assert html._columns(rows, "b", {"first": "f", "steady": "s"}) == {
        "first": [(64, 0.4), (512, 0.9)],
        "steady": [(64, 0.1), (512, 0.3)],
    }


WARMUP = ("warmup", {"rows": [{"bucket": 64, "first_s": 0.4, "steady_p50_s": 0.1}]})
NIAH = ("niah", {"by_length": [{"length": 256, "candidate": 0.5, "reference": 1.0}]})
LOAD = ("load", {"latency_series": [[0.0, 0.1, True], [1.0, 0.3, False]]})


def test_each_check_with_data_gets_its_chart_in_order() -> None:
    charts = html.plots(report(WARMUP, LOAD, NIAH, ("leakage", {"why": "no data"})))
    titles = ["Needle recall by context length", "Latency over time under load", "Warm-up"]
    assert len(charts) == 3
    assert all(title in chart for title, chart in zip(titles, charts, strict=True))
    assert "&#9632; steady p50" in charts[2] and "&#9632; error" in charts[1]


def test_no_data_no_chart() -> None:
    empty = report(("niah", {"by_length": []}), ("load", {}), ("warmup", {"rows": []}))
    assert html.plots(empty) == []
