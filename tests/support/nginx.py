"""A real nginx (Debian's, ``make nginx``) for the collector and follower tests.

Each test writes its own ``http { ... }`` body; ``Nginx`` puts it in a config of its
own prefix (pid, logs and temp paths there, nothing under /etc or /var), starts the
master in the foreground on loopback ports the test chose, reloads it the way an
operator does (``nginx -s reload`` with the same prefix and config), and always
stops it.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

from quantdrift.stack.ports import stop_popen


def nginx_binary() -> str:
    """nginx on PATH or in /usr/sbin (not on a non-root PATH); a missing one fails the test."""
    found = shutil.which("nginx") or (
        "/usr/sbin/nginx" if os.access("/usr/sbin/nginx", os.X_OK) else None
    )
    if found is None:
        pytest.fail("nginx is missing: `make nginx` installs Debian's (needs root)")
    return found


class Nginx:
    """One nginx master with ``http`` as its http block, in ``prefix``."""

    def __init__(self, prefix: Path, http: str, ports: list[int]) -> None:
        self.binary = nginx_binary()
        self.prefix = prefix
        self.ports = ports
        self.conf = prefix / "nginx.conf"
        self.error_log = prefix / "error.log"
        temp = prefix / "temp"
        temp.mkdir(parents=True, exist_ok=True)
        paths = "\n".join(
            f"  {kind}_temp_path {temp / kind};"
            for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
        )
        self.conf.write_text(
            f"worker_processes 1;\npid {prefix / 'nginx.pid'};\n"
            f"error_log {self.error_log} warn;\n"
            "events { worker_connections 1024; }\n"
            f"http {{\n  access_log off;\n{paths}\n{http}\n}}\n"
        )
        self.proc: subprocess.Popen[bytes] | None = None

    def argv(self, *extra: str) -> list[str]:
        return [self.binary, "-p", str(self.prefix), "-c", str(self.conf), *extra]

    @property
    def reload_cmd(self) -> str:
        """What an operator runs to reload this nginx gracefully."""
        return " ".join(self.argv("-s", "reload"))

    def start(self, timeout: float = 10.0) -> Nginx:
        check = subprocess.run(self.argv("-t"), capture_output=True, text=True, timeout=30)
        assert check.returncode == 0, check.stderr
        self.proc = subprocess.Popen(
            self.argv("-g", "daemon off;"),
            stdout=subprocess.DEVNULL,
            stderr=(self.prefix / "stderr.log").open("wb"),
        )
        deadline = time.monotonic() + timeout
        for port in self.ports:
            while True:
                assert self.proc.poll() is None, f"nginx exited:\n{self.log_tail()}"
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                    break
                except OSError:
                    assert time.monotonic() < deadline, f"nginx not listening:\n{self.log_tail()}"
                    time.sleep(0.05)
        return self

    def log_tail(self, n: int = 3000) -> str:
        parts = []
        for log in (self.error_log, self.prefix / "stderr.log"):
            if log.exists():
                parts.append(log.read_text(errors="replace")[-n:])
        return "\n".join(parts)

    def stop(self) -> None:
        if self.proc is not None:
            stop_popen(self.proc, timeout=10)  # SIGTERM: nginx's fast shutdown
            self.proc = None

    def __enter__(self) -> Nginx:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
