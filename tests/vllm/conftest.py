"""The vLLM tier: real vLLM engines (``.venv-vllm``, built by ``make vllm``).

Session fixtures: the embedded stack and Redis prefixes come from the ``support``
plugin, as for every tier; this file adds two engines started *concurrently*
through ``quantdrift lab vllm``, once per session: each takes about two minutes
to warm up on a 2-core machine.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from quantdrift.lab.vllm_process import EngineProcess, start_engine, wait_ready
from quantdrift.lab.vllm_server import find_python, int4_candidate
from quantdrift.stack import free_port

# Export (the GGUF load) plus engine warm-up, both engines at once on 2 shared cores.
READY_TIMEOUT_S = 1200.0
REFERENCE = "ref-f32"


@pytest.fixture(scope="session")
def vllm_engines(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[dict[str, EngineProcess]]:
    """The badly quantized candidate and the reference, served by real vLLM, by role
    (``candidate``, ``reference``); each engine's ``variant`` names what it serves."""
    if find_python() is None:
        pytest.fail("no .venv-vllm: run `make vllm` (make test builds it first)")
    folder = tmp_path_factory.mktemp("vllm")
    candidate = int4_candidate()  # the GPTQ checkpoint where its kernel runs here
    print(f"\nvLLM tier: candidate {candidate}, reference {REFERENCE}")
    engines = [
        start_engine(candidate, free_port(), folder, READY_TIMEOUT_S),
        start_engine(REFERENCE, free_port(), folder, READY_TIMEOUT_S),
    ]
    try:
        wait_ready(engines, READY_TIMEOUT_S + 60)
        yield {"candidate": engines[0], "reference": engines[1]}
    finally:
        for e in engines:
            e.stop()
