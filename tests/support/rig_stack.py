"""quantdrift's parts on the rig's hosts: Redis, the broker, workers and gateways, each in its
own namespace, plus a scripted upstream and an SDK load on the observer (this process).

Each part is started as production starts it (``redis-server``, the Tansu binary,
``python -m quantdrift worker|gateway``), wrapped in ``ip netns exec``; everything
started here is stopped by ``RigStack.close``, before the rig's namespaces go.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from subprocess import DEVNULL, STDOUT, Popen
from types import SimpleNamespace
from typing import Any

import openai

from quantdrift.config import Settings
from quantdrift.demo.workers import settings_env
from quantdrift.stack import default_server_bin, redis_ping
from quantdrift.stack.broker import kafka_metadata_ok, resolve_tansu_bin
from quantdrift.stack.ports import stop_popen
from support.gateway_process import GatewayProcess
from support.guard import isolated_settings, make_topics
from support.netrig import Rig
from support.scripted_llm import ScriptedLLM
from support.supervisor import Supervisor

REDIS_PORT, KAFKA_PORT, GATEWAY_PORT = 6379, 9092, 8080

# One Kafka Metadata (v0) round trip, timed from inside a host's namespace: the
# connection is opened first, so only the request and its answer are timed.
_ROUND_TRIP = """
import socket, struct, sys, time
body = struct.pack(">hhih", 3, 0, 7, 5) + b"probe" + struct.pack(">i", 0)
with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=10) as s:
    s.settimeout(10)
    t = time.perf_counter()
    s.sendall(struct.pack(">i", len(body)) + body)
    need = None
    got = b""
    while need is None or len(got) < need + 4:
        chunk = s.recv(65536)
        if not chunk:
            raise SystemExit("closed")
        got += chunk
        if need is None and len(got) >= 4:
            need = struct.unpack(">i", got[:4])[0]
    print(time.perf_counter() - t)
"""
ROUTE = "rig/int4"
SIGNING_KEY = "rig-signing-key-0123456789abcdef-0123456789"


def wait(predicate: Any, timeout: float, what: str) -> float:
    """Poll ``predicate`` until true; the seconds it took, or AssertionError."""
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)
    return time.monotonic() - start


@dataclass
class RigStack:
    """The parts of one run on a rig; ``close`` stops them all."""

    rig: Rig
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="qd-rig-")))
    procs: list[Popen[bytes]] = field(default_factory=list)
    gateways: list[GatewayProcess] = field(default_factory=list)
    supervisors: list[Supervisor] = field(default_factory=list)
    upstream: ScriptedLLM | None = None
    settings: Settings | None = None
    redis_proc: Popen[bytes] | None = None
    broker_proc: Popen[bytes] | None = None
    partitions: int = 2
    worker_nice: int = 0  # the workers' niceness: catching up a backlog, they share the cores

    @property
    def redis_url(self) -> str:
        return f"redis://{self.rig.addr('redis')}:{REDIS_PORT}"

    @property
    def bootstrap(self) -> str:
        return f"{self.rig.addr('broker')}:{KAFKA_PORT}"

    def _spawn(
        self, host: str, argv: list[str], name: str, env: dict[str, str] | None = None
    ) -> Popen[bytes]:
        log = (self.workdir / f"{name}.log").open("ab")
        proc = Popen(
            self.rig.exec_argv(host, argv),
            stdin=DEVNULL,
            stdout=log,
            stderr=STDOUT,
            env={**os.environ, **(env or {})},
            cwd=self.workdir,
        )
        self.procs.append(proc)
        return proc

    def log(self, name: str, n: int = 3000) -> str:
        path = self.workdir / f"{name}.log"
        return path.read_bytes()[-n:].decode("utf-8", "replace") if path.exists() else ""

    # -- the parts ---------------------------------------------------------------------

    def start_redis(self) -> RigStack:
        argv = [default_server_bin(), "--bind", self.rig.addr("redis"), "--port", str(REDIS_PORT)]
        argv += ["--save", "", "--appendonly", "no", "--protected-mode", "no"]
        argv += ["--dir", str(self.workdir)]
        self.redis_proc = self._spawn("redis", argv, "redis")
        wait(lambda: redis_ping(self.redis_url, timeout=0.3), 15, "redis on its host")
        return self

    def restart_redis(self) -> int:
        """SIGKILL Redis and start an empty one on the same address (it keeps nothing on
        disk): a restart that lost every key. Returns the killed server's exit status."""
        assert self.redis_proc is not None, "start Redis first"
        self.redis_proc.kill()
        status = self.redis_proc.wait(10)
        self.procs.remove(self.redis_proc)
        self.start_redis()
        return status

    def start_broker(self, partitions: int = 2) -> RigStack:
        self.partitions = partitions
        self._broker_up()
        prefix = f"qdrig:{uuid.uuid4().hex}:"
        stack = SimpleNamespace(bootstrap=self.bootstrap, redis_url=self.redis_url)
        self.settings = isolated_settings(stack, prefix, partitions)  # type: ignore[arg-type]
        asyncio.run(make_topics(self.settings))
        return self

    def _broker_up(self) -> None:
        url = f"tcp://{self.bootstrap}"
        argv = [resolve_tansu_bin(), "broker", "--listener-url", url]
        argv += ["--advertised-listener-url", url, "--storage-engine", "memory://tansu/"]
        self.broker_proc = self._spawn("broker", argv, "broker")
        host = self.rig.addr("broker")
        wait(lambda: kafka_metadata_ok(host, KAFKA_PORT, timeout=0.5), 15, "broker on its host")

    def restart_broker(self, while_down: Any = None) -> int:
        """SIGKILL the broker and start it again on the same address. Its storage is
        memory: the new one starts with no topic, record or group, and the topics are made
        again as they were. ``while_down()`` runs between the death and the new start.
        Returns the killed broker's exit status."""
        assert self.broker_proc is not None and self.settings is not None, "start it first"
        self.broker_proc.kill()
        status = self.broker_proc.wait(10)
        self.procs.remove(self.broker_proc)
        if while_down is not None:
            while_down()
        self._broker_up()
        asyncio.run(make_topics(self.settings))
        return status

    def broker_round_trip(self, host: str) -> float:
        """Seconds one Kafka request takes from ``host`` to the broker's address, measured
        in ``host``'s namespace, so through whatever that namespace does to the link."""
        argv = [sys.executable, "-c", _ROUND_TRIP, self.rig.addr("broker"), str(KAFKA_PORT)]
        done = subprocess.run(
            self.rig.exec_argv(host, argv), capture_output=True, text=True, timeout=60
        )
        if done.returncode != 0:
            raise AssertionError(f"round trip from {host}: {done.stderr.strip()[-300:]}")
        return float(done.stdout)

    def start_upstream(self) -> RigStack:
        """The scripted LLM on the observer: ``int4`` and ``bf16`` answer different texts."""
        llm = ScriptedLLM()
        llm.server.config.host = self.rig.addr("observer")
        llm.texts.update({"int4": "int4 says Paris.", "bf16": "bf16 says Paris."})
        self.upstream = llm.start()
        return self

    def env(self) -> dict[str, str]:
        """What a worker or gateway on the rig reads: topics, Redis, prefix."""
        assert self.settings is not None, "start the broker first"
        return {
            **settings_env(self.settings, self.redis_url),
            # The dev key is refused off loopback, as it should be: the rig's own.
            "QUANTDRIFT_SIGNING__KEYS": json.dumps({"rig": SIGNING_KEY}),
            "QUANTDRIFT_SIGNING__ACTIVE_KEY_ID": "rig",
        }

    def gateway_config(self, **extra: Any) -> dict[str, Any]:
        assert self.upstream is not None
        base = f"http://{self.rig.addr('observer')}:{self.upstream.port}"
        return {
            "precisions": {"int4": [f"{base}/int4"], "bf16": [f"{base}/bf16"]},
            "routes": {ROUTE: {"candidate": "int4", "reference": "bf16"}},
            "default_route": ROUTE,
            "sample_salt": "rig-sample-salt-0123456789abcdef",
            "logprobs_on_user_calls": False,
            "timeouts": {"connect_s": 1, "read_s": 5, "total_s": 10, "shadow_total_s": 10},
            **extra,
        }

    def start_gateway(
        self, host: str = "gateway", env: dict[str, str] | None = None, **extra: Any
    ) -> GatewayProcess:
        """A gateway on ``host``; ``env`` overrides its settings (e.g. Redis via a proxy)."""
        gw = GatewayProcess.launch(
            self.gateway_config(**extra),
            self.workdir,
            {**self.env(), **(env or {})},
            host=self.rig.addr(host),
            port=GATEWAY_PORT,
            control=True,
            netns=self.rig.ns(host),
            name=f"gateway-{host}",
        )
        self.gateways.append(gw)
        return gw.wait_up()

    def start_worker(self, host: str = "worker", **env: str) -> Popen[bytes]:
        """A worker on ``host``, at the rig's ``worker_nice`` (the gateway keeps 0)."""
        extra = {"TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
        extra |= {"QUANTDRIFT_EMBEDDING__TIER": "none", **env}
        argv = [sys.executable, "-m", "quantdrift", "worker", "--log-level", "info"]
        if self.worker_nice:
            argv = ["nice", "-n", str(self.worker_nice), *argv]
        return self._spawn(host, argv, f"worker-{host}", {**self.env(), **extra})

    def supervise_worker(self, host: str = "worker", **env: str) -> Supervisor:
        """A worker on ``host`` that is started again whenever it fails, as its service
        manager would; ``Supervisor.restarts`` records each exit."""
        sup = Supervisor(lambda: self.start_worker(host, **env), f"the worker on {host}")
        self.supervisors.append(sup)
        return sup

    def close(self) -> None:
        for sup in self.supervisors:  # first, so stopping a worker does not restart it
            sup.stop()
        for gw in self.gateways:
            gw.stop()
        for proc in reversed(self.procs):
            stop_popen(proc, timeout=10)
        if self.upstream is not None:
            self.upstream.stop()


@dataclass
class Load:
    """The openai SDK against one gateway from the observer, paced, until stopped.

    Each answer is recorded as (monotonic time, HTTP status, precision served); a
    connection error as status 0, anything else as -1 with its repr. No retries:
    every failure is seen, and the loop never dies silently.
    """

    url: str
    every_s: float = 0.1
    temperature: float | None = None  # 0: greedy, judged by similarity (None: sampled)
    seen: list[tuple[float, int, str]] = field(default_factory=list)
    errors: list[tuple[float, int, str]] = field(default_factory=list)  # what each failure said
    latency: list[tuple[float, float]] = field(default_factory=list)  # (sent at, seconds) of 200s
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> Load:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        client = openai.OpenAI(base_url=f"{self.url}/v1", api_key="rig", max_retries=0, timeout=15)
        while not self._stop.is_set():
            t = time.monotonic()
            try:
                extra = {} if self.temperature is None else {"temperature": self.temperature}
                raw = client.chat.completions.with_raw_response.create(
                    model=ROUTE,
                    messages=[{"role": "user", "content": "capital of France?"}],
                    **extra,
                )
                self.seen.append(
                    (
                        t,
                        raw.http_response.status_code,
                        raw.headers.get("x-quantdrift-precision", ""),
                    )
                )
                self.latency.append((t, time.monotonic() - t))
            except openai.APIStatusError as exc:
                self.seen.append((t, exc.status_code, ""))
                self.errors.append((t, exc.status_code, str(exc)[:300]))
            except openai.APIConnectionError as exc:
                self.seen.append((t, 0, ""))
                self.errors.append((t, 0, repr(exc.__cause__ or exc)[:300]))
            except Exception as exc:  # anything else is a failure the test must see
                self.seen.append((t, -1, repr(exc)))
            self._stop.wait(max(0.0, self.every_s - (time.monotonic() - t)))

    def since(self, t: float) -> list[tuple[float, int, str]]:
        return [s for s in list(self.seen) if s[0] >= t]

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(20)
