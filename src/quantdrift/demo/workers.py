"""Start worker processes for the demo, tests and benchmarks: real processes, real groups."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from quantdrift.config import Settings


def settings_env(settings: Settings, redis_url: str) -> dict[str, str]:
    """The QUANTDRIFT_* variables that make a child process see these settings."""
    k, w = settings.kafka, settings.worker
    env = {
        "QUANTDRIFT_KAFKA__BOOTSTRAP_SERVERS": k.bootstrap_servers,
        "QUANTDRIFT_KAFKA__PARTITIONS": str(k.partitions),
        "QUANTDRIFT_KAFKA__ENABLE_IDEMPOTENCE": str(k.enable_idempotence).lower(),
        "QUANTDRIFT_KAFKA__FETCH_MAX_WAIT_MS": str(k.fetch_max_wait_ms),
        "QUANTDRIFT_KAFKA__LINGER_MS": str(k.linger_ms),
        "QUANTDRIFT_REDIS__URL": redis_url,
        "QUANTDRIFT_REDIS__KEY_PREFIX": settings.redis.key_prefix,
        "QUANTDRIFT_WORKER__APP_ID": w.app_id,
        "QUANTDRIFT_WORKER__WEB_PORT": str(w.web_port),
        "QUANTDRIFT_WORKER__BROKER_SESSION_TIMEOUT_S": str(w.broker_session_timeout_s),
        "QUANTDRIFT_WORKER__BROKER_HEARTBEAT_INTERVAL_S": str(w.broker_heartbeat_interval_s),
        "QUANTDRIFT_WORKER__BROKER_REBALANCE_TIMEOUT_S": str(w.broker_rebalance_timeout_s),
        "QUANTDRIFT_WORKER__STALL_AFTER_S": str(w.stall_after_s),
        "QUANTDRIFT_EMBEDDING__MODEL": settings.embedding.model,
        "QUANTDRIFT_EMBEDDING__TIER": settings.embedding.tier,
        "QUANTDRIFT_EMBEDDING__DTYPE": settings.embedding.dtype,
    }
    for name, value in k.topics.model_dump().items():
        env[f"QUANTDRIFT_KAFKA__TOPICS__{name.upper()}"] = value
    if settings.policy_file is not None:
        env["QUANTDRIFT_POLICY_FILE"] = str(settings.policy_file)
    return env


@dataclass
class WorkerProcess:
    """One ``quantdrift worker`` child; its output goes to a log file, not our terminal."""

    settings: Settings
    redis_url: str
    log_path: Path = field(
        default_factory=lambda: Path(tempfile.mkstemp(prefix="qd-worker-", suffix=".log")[1])
    )
    proc: subprocess.Popen[bytes] | None = None
    log_level: str = "warning"
    """The worker's ``--log-level``: a soak that must explain a stall asks for ``info``."""

    def start(self) -> WorkerProcess:
        env = {
            **os.environ,
            **settings_env(self.settings, self.redis_url),
            "TOKENIZERS_PARALLELISM": "false",
            "HF_HUB_OFFLINE": "1",
            "OMP_NUM_THREADS": "1",
        }
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "quantdrift", "worker", "--log-level", self.log_level],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
        return self

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL, as a crash would: for fault tests."""
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def stop(self, timeout: float = 10.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=5)

    def log_tail(self, max_bytes: int = 3000) -> str:
        try:
            data = self.log_path.read_bytes()
        except OSError:
            return ""
        return data[-max_bytes:].decode("utf-8", "replace")
