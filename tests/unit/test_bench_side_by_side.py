"""bench/side_by_side_vllm.py's pure parts: the engines file, the gateway config it
builds (one route, the builds as extra candidates, vLLM teacher forcing on the
reference), the prompts it draws and the requests it sends (no seed: a seeded request
whose prefill is chunked kills vLLM's CPU engine core)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import side_by_side_vllm as bench  # bench/ is not a package

from quantdrift.gateway.gateway_config import candidate_route, parse_config

ENGINES = """# shared engines
ref-f32=http://127.0.0.1:8001
int8=http://127.0.0.1:8002/
int4-g64-gptq=http://127.0.0.1:8003
int3-g64=http://127.0.0.1:8004
"""


def test_the_config_judges_every_build_on_one_reference(tmp_path: Path) -> None:
    path = tmp_path / "engines.txt"
    path.write_text(ENGINES)
    engines = bench.read_engines(path)
    assert engines["int8"] == "http://127.0.0.1:8002" and len(engines) == 4
    args = argparse.Namespace(
        reference="ref-f32", candidate="int8", extra=["int4-g64-gptq", "int3-g64"],
        cost=[("int3-g64", 2.5)], concurrency=4, prompts=60, noise=0.3,
    )  # fmt: skip
    config = parse_config(bench.gateway_config(engines, {n: n for n in engines}, args))
    route = config.routes[bench.ROUTE]
    assert (route.candidate, route.reference, route.teacher_forced) == ("int8", "ref-f32", True)
    assert route.extra_candidates == ["int4-g64-gptq", "int3-g64"]
    assert config.pool("ref-f32").teacher_forcing == "vllm"
    assert all(config.pool(b).token_ids for b in ("int8", "int4-g64-gptq", "int3-g64"))
    costs = {b: config.pool(b).cost for b in ("int8", "int4-g64-gptq", "int3-g64")}
    assert costs == {"int8": 8.0, "int4-g64-gptq": 4.0, "int3-g64": 2.5}  # bits, or --cost
    assert config.shadow_rate(bench.ROUTE) == 1.0 and config.shadow_concurrency == 4
    assert candidate_route(bench.ROUTE, "int3-g64") == "corpus/side-by-side@int3-g64"


def test_a_malformed_engines_line_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "engines.txt"
    path.write_text("ref-f32 127.0.0.1:8001\n")
    with pytest.raises(SystemExit, match="expected NAME=URL"):
        bench.read_engines(path)


def test_the_prompts_are_sampled_short_and_sent_without_a_seed() -> None:
    prompts = bench.sampled_prompts(60, 1024)
    assert len(prompts) == 60
    assert all(p["decoding"] == "sampled" and p["input_tokens"] <= 1024 for p in prompts)
    options = bench.request_options(prompts[0], 64)
    assert "seed" not in options and options["max_tokens"] <= 64
