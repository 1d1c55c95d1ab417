"""The launch page: the standard's order and words, values in words, charts, the sign-off block.

The sign-off block is built from real approvals (``signoff.approve`` over the
report's bytes, as ``preflight sign`` makes them); the browser test in
tests/integration/test_preflight_page.py checks the same states on a page drawn
from a real ``quantdrift preflight`` run.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from quantdrift.preflight import html, plots, signoff, standard, wording
from quantdrift.preflight.report import Item, build_report, report_bytes


def report(*items: tuple[str, dict[str, Any]]) -> dict[str, Any]:
    return {"items": [{"id": cid, "evidence": evidence} for cid, evidence in items]}


def test_evidence_is_none_for_a_missing_check_or_key() -> None:
    r = report(("niah", {"by_length": [1]}))
    assert plots.evidence(r, "niah", "by_length") == [1]
    assert plots.evidence(r, "niah", "other") is None
    assert plots.evidence(r, "load", "latency_series") is None


def test_columns_pair_one_x_with_each_named_column() -> None:
    rows = [{"b": 64, "f": 0.4, "s": 0.1}, {"b": 512, "f": 0.9, "s": 0.3}]
    assert plots.columns(rows, "b", {"first": "f", "steady": "s"}) == {
        "first": [(64, 0.4), (512, 0.9)],
        "steady": [(64, 0.1), (512, 0.3)],
    }


WARMUP = ("warmup", {"rows": [{"bucket": 64, "first_s": 0.4, "steady_p50_s": 0.1}]})
NIAH = ("niah", {"by_length": [{"length": 256, "candidate": 0.5, "reference": 1.0}]})
LATENCY = [[0.0, 0.1, True], [1.0, 0.3, False]]
RSS = {"gateway": [100.0, 101.0, 103.0]}
LOAD = ("load", {"latency_series": LATENCY, "rss_series_mb": RSS, "rss_every_s": 0.5})
SWITCHES = [
    {"action": "rollback", "apply_s": 0.12, "cli_s": 0.05},
    {"action": "restore", "apply_s": 1.4, "cli_s": 0.06},
]
DRILL = ("switch-drill", {"switches": SWITCHES})
PPL = ("perplexity", {"per_domain": {"catalog": {"candidate": 12.0, "reference": 11.0}}})


def test_each_check_with_data_gets_its_chart_in_launch_order() -> None:
    charts = plots.plots(report(WARMUP, LOAD, NIAH, DRILL, PPL, ("leakage", {"why": "no"})))
    titles = ["Needle recall per context length", "Perplexity per domain", "Warm-up",
              "Switch drill", "latency over time", "memory (RSS) over time"]  # fmt: skip
    assert len(charts) == len(titles)
    assert all(title in chart for title, chart in zip(titles, charts, strict=True))


def test_no_data_no_chart() -> None:
    empty = report(("niah", {"by_length": []}), ("load", {}), ("warmup", {"rows": []}))
    assert plots.plots(empty) == []


def test_needle_grid_has_one_cell_per_length_and_language_judged_per_cell() -> None:
    cases = [
        {"length": n, "language": lang, "candidate_hit": hit, "reference_hit": True}
        for n in (256, 1024)
        for lang, hit in (("en", True), ("zh", n == 256), ("ja", True))
    ]
    r = {"items": [{"id": "niah", "evidence": {"cases": cases},
                    "threshold": {"floor": 0.75, "tolerance": 0.05}}]}  # fmt: skip
    svg = plots.needle_grid(r)
    cells = re.findall(r'data-language="(\w+)" data-length="(\d+)" data-state="([\w-]+)"', svg)
    assert sorted(cells) == sorted(
        [("en", "256", "pass"), ("en", "1024", "pass"), ("ja", "256", "pass"),
         ("ja", "1024", "pass"), ("zh", "256", "pass"), ("zh", "1024", "fail")]
    )  # fmt: skip
    assert "0 % / 100 %" in svg


def test_drill_timeline_marks_a_switch_past_the_bound() -> None:
    r = report(DRILL)
    r["items"][0]["threshold"] = {"max_apply_s": 1.0}
    svg = plots.drill_timeline(r)
    assert "applied at 120 ms" in svg and "applied at 1400 ms" in svg and "bound 1 s" in svg
    bars = re.findall(r'<rect [^>]*fill="(#\w+)"', svg)
    assert bars == [plots.GOOD, plots.BAD]  # the restore took 1.4 s: past the bound


@pytest.mark.parametrize(
    ("cid", "measured", "threshold", "want_measured", "want_threshold"),
    [
        ("niah", {"candidate_recall": 0.8333, "reference_recall": 0.8333, "cases": 12,
                  "lengths": [256], "context_length": 8192},
         {"floor": 0.75, "tolerance": 0.05},
         "recall 83 % vs reference 83 % over 12 cases at 256 tokens (context 8,192 tokens)",
         "floor 75 %, tolerance 5 points"),
        ("perplexity", {"candidate": 12.31, "reference": 12.2, "rise": 0.009, "tokens": 640,
                        "texts": 8}, {"tolerance": 0.05},
         "perplexity 12.31 vs reference 12.2 (0.9 % rise) over 640 tokens of 8 texts",
         "at most 5 % above the reference"),
        ("switch-drill", {"rollback_s": 0.12, "restore_s": 0.098, "route_restored": True},
         {"max_apply_s": 1.0},
         "rollback applied in 120 ms, restore in 98 ms; route left as found",
         "each switch under 1.00 s; the route left as found"),
        ("memory-utilization", {"gpu_memory_utilization": 0.95}, {"lo": 0.9, "hi": 0.92},
         "gpu_memory_utilization 0.95", "between 0.9 and 0.92"),
        ("load", {"rate_rps": 3.0, "requests": 90, "error_rate": 0.0, "p50_s": 0.41,
                  "p99_s": 1.2, "longest_stall_s": 0.5, "rss_growth": {"gateway": 0.03}},
         {"multiplier": 1.5, "max_error_rate": 0.01, "max_p99_s": None, "stall_s": 10,
          "max_rss_growth": 0.25, "duration_s": 60},
         "90 requests at 3 req/s (1.5x peak 2 req/s): 0.0 % errors, p50 410 ms, p99 1.20 s, "
         "longest stall 500 ms; memory (RSS) gateway +3 %",
         "for 60 s at 1.5x peak: errors at most 1.0 %, no stall of 10 s, no error burst, "
         "RSS growth at most 25 %"),
    ],
)  # fmt: skip
def test_values_in_words_and_units(cid, measured, threshold, want_measured, want_threshold):  # type: ignore[no-untyped-def]
    got = wording.words({"id": cid, "measured": measured, "threshold": threshold})
    assert got == (want_measured, want_threshold)


def test_an_unknown_shape_is_read_as_key_value_pairs_never_json() -> None:
    m, t = wording.words({"id": "niah", "measured": {"odd": 1}, "threshold": {"floor": 0.9}})
    assert "{" not in m + t  # whatever the shape, no JSON on the page
    assert wording.words({"id": "new-check", "measured": {"x_y": 2}, "threshold": {}}) == (
        "x y 2",
        "",
    )


def test_checklist_follows_the_launch_standard_and_never_passes_what_did_not_run() -> None:
    r = build_report(
        [
            Item(
                "warmup",
                "W",
                "pass",
                {"worst_ratio": 1.2, "buckets": {"64": 1.2}},
                {"max_ratio": 3.0},
            ),
            Item("memory-utilization", "M", "skipped", evidence={"reason": "CPU server"}),
            Item("niah", "N", "fail", evidence={"why": "recall 50 %"}),
        ],
        waivers={"memory-utilization": "lab runs on CPU"},
    )
    rows = standard.rows(r)
    assert [x.item.name for x in rows][:3] == [
        "Calibration-set leakage",
        "Salient-weight protection",
        "Long-context needle recall",
    ]
    assert len(rows) == 10 and [x.item.number for x in rows] == list(range(1, 11))
    shown = {x.item.check: x.shown for x in rows}
    assert shown["niah"] == "fail" and shown["warmup"] == "pass"
    assert shown["memory-utilization"] == "not run" and shown["load"] == "not run"
    mem = next(x for x in rows if x.item.check == "memory-utilization")
    assert mem.why == "CPU server" and mem.waiver == "lab runs on CPU"
    assert next(x for x in rows if x.item.check == "niah").veto


def test_no_go_page_says_why_in_one_line_at_the_top() -> None:
    r = build_report([Item("niah", "N", "fail", evidence={"why": "recall 50 % < floor 90 %"})])
    page = html.render(r)
    top = page[: page.index("<h2>")]
    assert "NO-GO" in top
    assert (
        "No-go: Long-context needle recall vetoes the launch (recall 50 % &lt; floor 90 %)." in top
    )
    assert "{&quot;" not in page and '{"' not in page  # no JSON dump anywhere


def _block(r: dict[str, Any], approvals: list[dict[str, Any]], keys: dict[str, bytes]):  # type: ignore[no-untyped-def]
    return signoff.block(report_bytes(r), approvals, keys)


KEYS = {"ops": b"ops-key-of-at-least-32-bytes-long!!", "ml": b"ml-key-of-at-least-32-bytes-long!!!"}


def test_signoff_block_states() -> None:
    r = build_report([Item("probes", "P", "pass")], generated_at=1.0)
    raw = report_bytes(r)
    alice = signoff.approve(raw, "alice", "ops", KEYS["ops"], 10.0)
    bob = signoff.approve(raw, "bob", "ml", KEYS["ml"], 20.0)
    assert _block(r, [], KEYS).state == "unsigned"
    one = _block(r, [alice], KEYS)
    assert (one.state, one.valid, one.missing) == ("partial", 1, ["1 more signer (1 of 2 so far)"])
    two = _block(r, [alice, bob], KEYS)
    assert two.state == "complete" and two.missing == [] and two.verification.ok
    edited = {**r, "generated_at": 2.0}  # the report changed after both signed
    broken = _block(edited, [alice, bob], KEYS)
    assert broken.state == "broken" and broken.valid == 0
    assert [s.problem for s in broken.signatures] == [
        "signed another version of the report",
        "signed another version of the report",
    ]
    assert broken.missing[-1] == "bob (ml): signed another version of the report"
    nogo = build_report([Item("niah", "N", "fail")])
    assert _block(nogo, [], KEYS).state == "not-signable"


def test_signoff_block_on_the_page() -> None:
    r = build_report([Item("probes", "P", "pass")], generated_at=1.0)
    raw = report_bytes(r)
    alice = signoff.approve(raw, "alice", "ops", KEYS["ops"], 10.0)
    page = html.render(r, _block(r, [alice], KEYS))
    assert 'id="signoff" data-state="partial" data-valid="1" data-required="2"' in page
    assert "Partly signed" in page and "1970-01-01 00:00:10 UTC" in page
    assert '<tr class="signature" data-verifies="true"><td>alice</td>' in page
    assert signoff.digest(raw) in page and "1 more signer (1 of 2 so far)" in page
