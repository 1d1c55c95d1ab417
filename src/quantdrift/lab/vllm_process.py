"""``quantdrift lab vllm`` as a child process: start it, read its ready line, stop it.

The vLLM test tier and the benches that need real engines (``bench/preflight_vllm.py``,
``bench/gateway_vllm.py``) all start engines this way, so they agree on the command,
the environment (no hub, no tokenizer threads) and on how an engine that never
came up is reported: with the tail of its log.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class EngineProcess:
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


def start_engine(
    variant: str,
    port: int,
    folder: Path,
    ready_timeout_s: float,
    extra: Sequence[str] = (),
    model_dir: Path | None = None,
) -> EngineProcess:
    """Start ``variant`` on ``port`` (the caller picks a free one), its model folder
    (unless ``model_dir`` names an exported one) and log under ``folder``; ``extra``
    are more ``lab vllm`` options (e.g. ``--max-model-len``)."""
    log = folder / f"vllm-{variant}.log"
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "quantdrift", "lab", "vllm", "--variant", variant),
            *("--port", str(port), "--model-dir", str(model_dir or folder / variant)),
            *("--ready-timeout", str(ready_timeout_s)),
            *extra,
        ],
        stdout=subprocess.PIPE,
        stderr=log.open("ab"),
        env={**os.environ, "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"},
        cwd=folder,
    )
    return EngineProcess(variant, port, proc, log)


def wait_ready(engines: Sequence[EngineProcess], timeout_s: float) -> None:
    """Read each command's one ready line, all at once (engines warm up together);
    an AssertionError with the log's tail for one that never came up."""

    def read(e: EngineProcess) -> None:
        assert e.proc.stdout is not None
        line = e.proc.stdout.readline()
        if line:
            e.ready = json.loads(line)

    threads = [threading.Thread(target=read, args=(e,), daemon=True) for e in engines]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout_s)
    for e in engines:
        assert e.ready and e.ready.get("ready"), f"{e.variant} never ready:\n{e.tail()}"
