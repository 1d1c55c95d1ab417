"""`quantdrift lab serve` processes for the tests that need a real small model."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from quantdrift.stack import free_port
from quantdrift.stack.ports import stop_popen


def start_lab(
    variants: dict[str, str], logs: Path
) -> tuple[list[subprocess.Popen[bytes]], dict[str, str]]:
    """``quantdrift lab serve`` per variant, healthy; (processes, {name: url})."""
    procs, urls = [], {}
    for name, variant in variants.items():
        port = free_port()
        log = (logs / f"{name}.log").open("wb")
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "quantdrift", "lab", "serve", "--precision", variant,
                 "--port", str(port), "--threads", "1"],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        )  # fmt: skip
        urls[name] = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    for name, url in urls.items():
        while True:
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                for p in procs:
                    stop_popen(p, timeout=10)
                tail = Path(logs / f"{name}.log").read_text()[-2000:]
                pytest.fail(f"lab serve {name} did not come up:\n{tail}")
            time.sleep(0.5)
    return procs, urls
