"""A real ``quantdrift gateway`` process for fault tests, on loopback or inside a namespace.

The gateway is started the way an operator starts it (``python -m quantdrift
gateway --config ...``), so what a test sees is what the CLI builds: uvicorn with
the gateway's own HTTP protocol, its lifespan, its metrics. ``netns`` runs it
inside a network namespace (``ip netns exec``), for the multi-host rig.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml
from prometheus_client.parser import text_string_to_metric_families

from quantdrift.stack import free_port
from quantdrift.stack.ports import stop_popen

REPO = Path(__file__).resolve().parents[2]
EXAMPLE_CONFIG = REPO / "examples" / "gateway.yaml"


@dataclass
class GatewayProcess:
    """One gateway child: its address, its log, and readers for its health and metrics."""

    host: str
    port: int
    log: Path
    proc: subprocess.Popen[bytes]

    @classmethod
    def launch(
        cls,
        config: Path | dict[str, Any],
        workdir: Path,
        env: dict[str, str],
        *,
        host: str = "127.0.0.1",
        port: int | None = None,
        control: bool = False,
        netns: str | None = None,
        name: str = "gateway",
    ) -> GatewayProcess:
        """Start ``quantdrift gateway``; ``config`` is a file or a dict written as one."""
        if isinstance(config, dict):
            path = workdir / f"{name}.yaml"
            path.write_text(yaml.safe_dump(config, sort_keys=False))
            config = path
        port = port or free_port()
        log = workdir / f"{name}.log"
        argv = [sys.executable, "-m", "quantdrift", "gateway", "--config", str(config)]
        argv += ["--host", host, "--port", str(port), "--log-level", "warning"]
        if not control:
            argv.append("--no-control")
        if netns is not None:
            argv = ["ip", "netns", "exec", netns, *argv]
        full_env = {**os.environ, "OMP_NUM_THREADS": "1", **env}
        proc = subprocess.Popen(
            argv,
            stdout=log.open("ab"),
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=full_env,
            cwd=workdir,
        )
        return cls(host, port, log, proc)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def tail(self, n: int = 4000) -> str:
        return self.log.read_bytes()[-n:].decode("utf-8", "replace")

    def wait_up(self, timeout: float = 60.0) -> GatewayProcess:
        deadline = time.monotonic() + timeout
        while True:
            try:
                if httpx.get(f"{self.url}/health", timeout=1.0).status_code in (200, 503):
                    return self
            except httpx.HTTPError:
                pass
            assert self.proc.poll() is None, f"gateway exited:\n{self.tail()}"
            assert time.monotonic() < deadline, f"gateway not up:\n{self.tail()}"
            time.sleep(0.1)

    def health(self) -> dict[str, Any]:
        body: dict[str, Any] = httpx.get(f"{self.url}/health", timeout=5.0).json()
        return body

    def metric(self, name: str, **labels: str) -> float:
        """Sum of the samples called ``name`` whose labels include ``labels``."""
        text = httpx.get(f"{self.url}/metrics", timeout=5.0).text
        total = 0.0
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == name and all(
                    sample.labels.get(k) == v for k, v in labels.items()
                ):
                    total += sample.value
        return total

    def stop(self) -> None:
        stop_popen(self.proc, timeout=15)
