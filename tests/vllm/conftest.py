"""The vLLM tier: real vLLM engines (``.venv-vllm``, built by ``make vllm``).

Session fixtures: the integration tier's embedded stack and Redis prefixes (the
same fixture functions, loaded from ``tests/integration/conftest.py``), and two
engines started *concurrently* through ``quantdrift lab vllm``, once per session:
each takes about two minutes to warm up on a 2-core machine.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from quantdrift.lab.vllm_server import find_python
from quantdrift.stack import free_port

_HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(_HERE.parent / "integration"))  # guard.py, test_rollback_e2e.py

_spec = importlib.util.spec_from_file_location(
    "quantdrift_integration_fixtures", _HERE.parent / "integration" / "conftest.py"
)
assert _spec is not None and _spec.loader is not None
_fixtures = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_fixtures)
stack = _fixtures.stack
redis_prefix = _fixtures.redis_prefix

# Export (the GGUF load) plus engine warm-up, both engines at once on 2 shared cores.
READY_TIMEOUT_S = 1200.0
CANDIDATE = "int4-g64-gptq"  # the real quantized format, on vLLM's own int4 kernel
REFERENCE = "ref-f32"


@dataclass
class Engine:
    """One ``quantdrift lab vllm`` process and what its ready line said."""

    variant: str
    port: int
    proc: subprocess.Popen[bytes]
    log: Path
    ready: dict[str, Any] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def tail(self, n: int = 4000) -> str:
        try:
            return self.log.read_bytes()[-n:].decode("utf-8", "replace")
        except OSError:
            return ""

    def stop(self) -> None:
        """SIGTERM the command: it stops its engine's process group, then exits."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


def start_engine(variant: str, folder: Path) -> Engine:
    port = free_port()
    log = folder / f"vllm-{variant}.log"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "quantdrift",
            "lab",
            "vllm",
            "--variant",
            variant,
            "--port",
            str(port),
            "--model-dir",
            str(folder / variant),
            "--ready-timeout",
            str(READY_TIMEOUT_S),
        ],
        stdout=subprocess.PIPE,
        stderr=log.open("ab"),
        env={**os.environ, "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"},
        cwd=folder,
    )
    return Engine(variant, port, proc, log)


def wait_ready(engines: list[Engine]) -> None:
    """Read each command's one ready line (threads: both engines warm up at once)."""

    def read(e: Engine) -> None:
        assert e.proc.stdout is not None
        line = e.proc.stdout.readline()
        if line:
            e.ready = json.loads(line)

    threads = [threading.Thread(target=read, args=(e,), daemon=True) for e in engines]
    for t in threads:
        t.start()
    for t in threads:
        t.join(READY_TIMEOUT_S + 60)
    for e in engines:
        assert e.ready and e.ready.get("ready"), f"{e.variant} never ready:\n{e.tail()}"


@pytest.fixture(scope="session")
def vllm_engines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Engine]]:
    """The badly quantized candidate and the reference, served by real vLLM."""
    if find_python() is None:
        pytest.fail("no .venv-vllm: run `make vllm` (make test builds it first)")
    folder = tmp_path_factory.mktemp("vllm")
    engines = [start_engine(CANDIDATE, folder), start_engine(REFERENCE, folder)]
    try:
        wait_ready(engines)
        yield {e.variant: e for e in engines}
    finally:
        for e in engines:
            e.stop()
