"""Preflight against two real `quantdrift lab serve` upstreams (SmolLM2-135M on CPU).

A broken RTN candidate (int2-g64) must get no-go with a niah or perplexity veto;
the healthy int8 candidate gets go on the same checks with the same thresholds.
Bounded for 2 CPU cores: one haystack length, two depths, two needles per depth.
The lab model's own reference misses a needle now and then at 1k tokens, so
the YAML's floor and tolerance are the ones a 135M model can meet; production
sets 0.9 / 0.05 (the defaults).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from quantdrift.stack import free_port
from quantdrift.stack.ports import stop_popen
from support.cli import quantdrift
from support.lab import start_lab

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

VARIANTS = {"reference": "ref-f32", "int8": "int8", "broken": "int2-g64"}


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    pytest.importorskip("transformers")
    procs, urls = start_lab(VARIANTS, tmp_path_factory.mktemp("lab"))
    try:
        yield urls
    finally:
        for p in procs:
            stop_popen(p, timeout=10)


def _preflight(tmp_path: Path, candidate: str, reference: str, name: str) -> tuple[int, dict]:
    cfg = tmp_path / "preflight.yaml"
    cfg.write_text(
        # English only: SmolLM2-135M is an English model, its own reference finds few
        # Chinese or Japanese needles (docs/preflight.md), so every build would be no-go.
        "niah: {depths: [0.25, 0.75], per_cell: 2, max_tokens: 24, floor: 0.5, tolerance: 0.25,"
        " languages: [en]}\n"
        "perplexity: {tolerance: 0.05}\n"
    )
    report = tmp_path / f"{name}.json"
    t0 = time.monotonic()
    proc = quantdrift(
        *("preflight", "--config", str(cfg), "--candidate", candidate, "--reference", reference),
        *("--niah-lengths", "256", "--only", "niah,perplexity", "--json", "--report", str(report)),
        cwd=Path.cwd(),
        env=os.environ,
        timeout=600,
    )
    assert proc.stderr.count("preflight: [") >= 4, proc.stderr  # progress on stderr
    printed = json.loads(proc.stdout)
    assert printed == json.loads(report.read_text())
    page = (tmp_path / f"{name}.html").read_text()
    items = {i["id"]: i for i in printed["items"]}
    # The launch page of this run: needle recall in words and per cell, perplexity per domain.
    niah = items["niah"]
    assert f'data-check="niah" data-status="{niah["status"]}"' in page
    recall = niah["measured"]["candidate_recall"]
    assert f"recall {recall * 100:.0f} % vs reference" in page
    assert "floor 50 %, tolerance 25 points, in every language x length cell" in page
    assert 'data-language="en" data-length="256"' in page  # the grid's one cell
    assert "Perplexity per domain" in page and "support-qa" in page
    assert page.count("<svg") >= 2
    # The engines as the servers report them (the lab's /health: model and precision).
    engines = printed["subject"]["engines"]
    assert engines["candidate"]["engine"] == "quantdrift lab serve"
    assert engines["reference"]["model"].endswith("@ref-f32")
    print(
        f"\n{name}: {printed['verdict']} in {time.monotonic() - t0:.0f}s; "
        f"niah {items['niah']['measured']}; perplexity {items['perplexity']['measured']}"
    )
    return proc.returncode, printed


def test_broken_candidate_vetoed_healthy_goes(lab: dict[str, str], tmp_path: Path) -> None:
    code, broken = _preflight(tmp_path, lab["broken"], lab["reference"], "int2")
    assert code == 1 and broken["verdict"] == "no-go"
    assert {v["id"] for v in broken["vetoes"]} & {"niah", "perplexity"}

    code, healthy = _preflight(tmp_path, lab["int8"], lab["reference"], "int8")
    assert healthy["verdict"] == "go", healthy["blocking"]
    assert code == 0 and healthy["vetoes"] == []
    assert [i["status"] for i in healthy["items"]] == ["pass", "pass"]


def test_load_warmup_and_probes_through_a_real_gateway(lab: dict[str, str], tmp_path: Path) -> None:
    """`quantdrift gateway` in front of the int8 and reference lab servers, loaded open-loop at
    1.5x a stated peak the CPU lab can carry, with the gateway's and upstream's RSS watched."""
    gw_cfg = tmp_path / "gateway.yaml"
    gw_cfg.write_text(
        f"precisions: {{int8: [{lab['int8']}], bf16: [{lab['reference']}]}}\n"
        "routes: {lab/int8: {candidate: int8, reference: bf16}}\n"
        "shadow_sample_rate: 0.05\n"
    )
    port = free_port()
    log = (tmp_path / "gateway.log").open("wb")
    gw = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "quantdrift",
            "gateway",
            "--config",
            str(gw_cfg),
            "--port",
            str(port),
            "--no-control",
            "--log-level",
            "warning",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=tmp_path,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert gw.poll() is None and time.monotonic() < deadline, (
                tmp_path / "gateway.log"
            ).read_text()[-2000:]
            time.sleep(0.2)
        cfg = tmp_path / "preflight.yaml"
        cfg.write_text(
            f"gateway_config: {gw_cfg}\nroute: lab/int8\n"
            "warmup: {buckets: [64, 256], steady: 3, max_tokens: 8}\n"
            f"load: {{peak_rps: 0.2, duration_s: 20, max_tokens: 8, pids: {{gateway: {gw.pid}}}}}\n"
        )
        report = tmp_path / "load.json"
        proc = quantdrift(
            *("preflight", "--config", str(cfg), "--candidate", lab["int8"], "--gateway-url", url),
            *("--only", "warmup,probes,load", "--json", "--report", str(report)),
            cwd=Path.cwd(),
            env=os.environ,
            timeout=300,
        )
        printed = json.loads(proc.stdout)
        items = {i["id"]: i for i in printed["items"]}
        print(f"\nwarmup {items['warmup']['measured']}\nload {items['load']['measured']}")
        assert items["probes"]["status"] == "pass"
        load = items["load"]
        assert load["status"] == "pass", load["evidence"]["why"]
        assert load["measured"]["requests"] == 6 and load["measured"]["error_rate"] == 0
        assert load["evidence"]["rss_series_mb"]["gateway"]
        warm = items["warmup"]
        assert warm["status"] in ("pass", "fail") and len(warm["evidence"]["rows"]) == 2
        assert all(r["steady_p50_s"] > 0 for r in warm["evidence"]["rows"])
        # The load test's latency and memory over time, and the warm-up buckets.
        assert (tmp_path / "load.html").read_text().count("<svg") == 3
    finally:
        stop_popen(gw, timeout=10)
