"""A restartable Redis for fault tests; the guard-loop helpers they use are in
:mod:`support.guard` and :mod:`support.kafka`."""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from pathlib import Path

from quantdrift.stack import default_server_bin, free_port, redis_ping
from quantdrift.stack.ports import stop_popen


class PersistentRedis:
    """A redis-server we own, on a fixed port, with an fsync-always AOF.

    ``start_redis_server`` picks a new free port each time and runs without
    persistence, which is right for a throwaway server but cannot be restarted:
    a production Redis comes back on its address with its data, so this one
    does too (same port, same ``--dir``).
    """

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}"
        self.dir = Path(tempfile.mkdtemp(prefix="qd-faults-redis-"))
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 10.0) -> PersistentRedis:
        argv = [
            default_server_bin(),
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--save", "",
            "--appendonly", "yes",
            "--appendfsync", "always",
            "--daemonize", "no",
            "--dir", str(self.dir),
        ]  # fmt: skip
        log = (self.dir / "redis.log").open("ab")
        self._proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=self.dir
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if redis_ping(self.url, timeout=0.3):
                return self
            if self._proc.poll() is not None:
                break
            time.sleep(0.05)
        raise RuntimeError(f"redis-server on {self.port} did not start")

    def stop(self) -> None:
        if self._proc is not None:
            stop_popen(self._proc, timeout=5.0)
            self._proc = None

    def close(self) -> None:
        self.stop()
        for path in sorted(self.dir.rglob("*"), reverse=True):
            if path.is_dir():
                path.rmdir()
            else:
                path.unlink()
        os.rmdir(self.dir)
