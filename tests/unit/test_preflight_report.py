"""The verdict rule, the report's bytes, the HTML page, two-person sign-off, the CLI's edges."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from pydantic import SecretStr

from quantdrift.cli import main
from quantdrift.config import SigningSettings
from quantdrift.errors import SignatureError
from quantdrift.preflight import html, signoff
from quantdrift.preflight.config import parse
from quantdrift.preflight.context import Context
from quantdrift.preflight.report import Item, build_report, decide, report_bytes
from quantdrift.preflight.runner import run, select

PASS = Item("probes", "Probes", "pass")


@pytest.mark.parametrize(
    ("items", "waivers", "verdict", "vetoes"),
    [
        ([PASS], {}, "go", []),
        ([PASS, Item("warmup", "W", "skipped", evidence={"reason": "no GPU"})], {}, "no-go", []),
        (
            [PASS, Item("memory-utilization", "M", "skipped")],
            {"memory-utilization": "CPU lab"},
            "go",
            [],
        ),
        ([Item("load", "L", "fail", evidence={"why": "stall"})], {"load": "waived"}, "no-go", []),
        (
            [Item("niah", "N", "fail", evidence={"why": "recall 0.5"})],
            {},
            "no-go",
            [{"id": "niah", "reason": "recall 0.5"}],
        ),
        (
            [Item("perplexity", "P", "fail")],
            {},
            "no-go",
            [{"id": "perplexity", "reason": "failed"}],
        ),
        ([], {}, "no-go", []),
    ],
)
def test_verdict(items, waivers, verdict, vetoes) -> None:  # type: ignore[no-untyped-def]
    d = decide(items, waivers=waivers)
    assert (d.verdict, d.vetoes) == (verdict, vetoes)


def test_a_skip_is_never_a_pass_even_beside_passes() -> None:
    d = decide([PASS, Item("niah", "N", "skipped", evidence={"reason": "no endpoints"})])
    assert d.verdict == "no-go" and d.vetoes == []
    assert d.blocking == ["niah: skipped (a skip is never a pass)"]


def test_report_shape_and_bytes() -> None:
    r = build_report([PASS], generated_at=1.0)
    assert set(r) >= {"verdict", "items", "vetoes"}
    assert set(r["items"][0]) == {"id", "title", "status", "measured", "threshold", "evidence"}
    raw = report_bytes(r)
    assert json.loads(raw) == r and raw.endswith(b"\n")
    with pytest.raises(ValueError):
        report_bytes({**r, "x": float("nan")})  # never write non-JSON


def test_html_has_inline_svg_plots_and_no_network() -> None:
    niah = Item(
        "niah",
        "NIAH",
        "fail",
        {"candidate_recall": 0.5},
        {"floor": 0.9},
        {
            "why": "recall <script>",
            "by_length": [
                {"length": 256, "candidate": 1.0, "reference": 1.0, "cases": 2},
                {"length": 1024, "candidate": 0.0, "reference": 1.0, "cases": 2},
            ],
        },
    )
    load = Item(
        "load", "Load", "pass", evidence={"latency_series": [[0.0, 0.1, True], [1.0, 0.3, False]]}
    )
    page = html.render(build_report([niah, load]))
    assert page.count("<svg") == 2 and "Needle recall per context length and language" in page
    assert "<script>" not in page and "&lt;script&gt;" in page
    assert "http://" not in page.replace('xmlns="http://www.w3.org/2000/svg"', "")


def _signing(*ids: str, active: str | None = None) -> SigningSettings:
    return SigningSettings(
        active_key_id=active or ids[0],
        keys={i: SecretStr(f"secret-{i}-key-of-at-least-32-bytes") for i in ids},
    )


def _write(tmp_path: Path, verdict_items: list[Item]) -> Path:
    path = tmp_path / "report.json"
    path.write_bytes(report_bytes(build_report(verdict_items)))
    return path


def test_two_distinct_signers_verify(tmp_path: Path) -> None:
    report = _write(tmp_path, [PASS])
    ring = _signing("ops", "ml")
    _, keys = signoff.key_ring(ring)
    raw = report.read_bytes()
    signoff.sign_file(report, "alice", ring, 100.0)
    v = signoff.verify(raw, signoff.read_approvals(report), keys)
    assert not v.ok and "1 distinct signers" in v.problems[-1]
    signoff.sign_file(report, "alice", ring, 101.0)  # the same person twice is one signer
    assert not signoff.verify(raw, signoff.read_approvals(report), keys).ok
    signoff.sign_file(report, "bob", _signing("ops", "ml", active="ml"), 102.0)
    v = signoff.verify(raw, signoff.read_approvals(report), keys)
    assert v.ok and v.signers == ["alice", "bob"]
    assert signoff.verify(raw, signoff.read_approvals(report), keys, distinct_keys=True).ok


def test_tampered_report_or_forged_approval_fails(tmp_path: Path) -> None:
    report = _write(tmp_path, [PASS])
    ring = _signing("ops")
    _, keys = signoff.key_ring(ring)
    signoff.sign_file(report, "alice", ring, 1.0)
    signoff.sign_file(report, "bob", ring, 2.0)
    approvals = signoff.read_approvals(report)
    raw = report.read_bytes()
    assert signoff.verify(raw, approvals, keys).ok
    edited = raw.replace(b'"verdict": "go"', b'"verdict": "go" ')
    assert not signoff.verify(edited, approvals, keys).ok
    forged = [approvals[0], {**approvals[1], "by": "carol"}]  # renamed: signature no longer fits
    v = signoff.verify(raw, forged, keys)
    assert not v.ok and "carol: bad signature" in v.problems
    wrong_ring = signoff.key_ring(
        _signing("ops", active="ops").model_copy(
            update={"keys": {"ops": SecretStr("other-key-of-at-least-32-bytes-long")}}
        )
    )[1]
    assert not signoff.verify(raw, approvals, wrong_ring).ok
    assert not signoff.verify(raw, approvals, {}).ok  # unknown key id


def test_no_go_cannot_be_signed_or_verified(tmp_path: Path) -> None:
    report = _write(tmp_path, [Item("niah", "N", "fail")])
    with pytest.raises(SignatureError):
        signoff.sign_file(report, "alice", _signing("ops"), 1.0)
    ring = _signing("ops")
    _, keys = signoff.key_ring(ring)
    raw = report.read_bytes()
    approvals = [signoff.approve(raw, n, "ops", keys["ops"], 1.0) for n in ("a", "b")]
    v = signoff.verify(raw, approvals, keys)
    assert not v.ok and v.problems == ["verdict is 'no-go', not 'go'"]


def test_cli_sign_and_verify(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report = _write(tmp_path, [PASS])
    assert main(["preflight", "verify", str(report)]) == 1
    assert main(["preflight", "sign", str(report), "--by", "alice"]) == 0
    assert main(["preflight", "sign", str(report), "--by", "bob"]) == 0
    assert main(["preflight", "verify", str(report), "--json"]) == 0
    out = capsys.readouterr().out.strip().splitlines()[-1]
    assert json.loads(out)["signers"] == ["alice", "bob"]


@pytest.mark.parametrize(
    "argv",
    [
        ["preflight", "--only", "niah,bogus"],
        ["preflight", "--niah-lengths", "abc"],
        ["preflight", "sign", "r.json"],
    ],
)
def test_bad_arguments_get_one_line(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("quantdrift: error:")


def test_select_keeps_launch_order() -> None:
    assert select(["perplexity", "warmup", "niah"]) == ["warmup", "niah", "perplexity"]


def test_checks_without_inputs_skip_with_a_reason(tmp_path: Path) -> None:
    ctx = Context(parse({}))
    only = [
        "calibration-leakage",
        "salient-weights",
        "fp8-scales",
        "memory-utilization",
        "probes",
        "shadow-link",
        "warmup",
        "niah",
        "perplexity",
        "switch-drill",
        "load",
    ]
    report = asyncio.run(run(ctx, only))
    assert report["verdict"] == "no-go"
    assert {i["status"] for i in report["items"]} == {"skipped"}
    assert all(i["evidence"]["reason"] for i in report["items"])


def test_yaml_paths_resolve_against_the_file(tmp_path: Path) -> None:
    from quantdrift.preflight.config import load

    (tmp_path / "p.yaml").write_text(
        "calibration-leakage: {calibration: data/c.jsonl, evaluation: /abs/e.jsonl}\n"
        "niah: {lengths: [256]}\n"
    )
    cfg = load(tmp_path / "p.yaml")
    assert cfg.calibration_leakage.calibration == tmp_path / "data/c.jsonl"
    assert cfg.calibration_leakage.evaluation == Path("/abs/e.jsonl")
    assert cfg.niah.lengths == [256]


def test_a_check_that_cannot_run_fails_and_the_others_still_report(tmp_path: Path) -> None:
    cfg = parse(
        {
            "salient_weights": {"checkpoint": str(tmp_path / "missing")},
            "memory_utilization": {"serving_config": str(tmp_path / "missing.yaml")},
            "load": {"url": "http://127.0.0.1:9"},  # no peak given
        }
    )
    report = asyncio.run(run(Context(cfg), ["salient-weights", "memory-utilization", "load"]))
    by = {i["id"]: i for i in report["items"]}
    assert by["salient-weights"]["status"] == "fail"
    assert "checkpoint not found" in by["salient-weights"]["evidence"]["why"]
    assert by["memory-utilization"]["status"] == "fail"
    assert by["load"]["status"] == "skipped" and "peak_rps" in by["load"]["evidence"]["reason"]
    assert report["verdict"] == "no-go"
