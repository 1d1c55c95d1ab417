"""Settings, built once at the entry point and passed down.

Nothing below ``cli`` and ``streams.app`` reads the environment: everything else
gets a ``Settings`` (or one of its sections) as an argument, so tests build
their own and never depend on the machine they run on.
"""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from quantdrift.errors import ConfigError


class TopicNames(BaseModel):
    """Topic names; versioned so a breaking schema change gets new topics."""

    pairs: str = "quantdrift.pairs.v1"
    scores: str = "quantdrift.scores.v1"
    control: str = "quantdrift.control.v1"
    alerts: str = "quantdrift.alerts.v1"
    dlq: str = "quantdrift.dlq.v1"
    degradations: str = "quantdrift.degradations.v1"


class KafkaSettings(BaseModel):
    """Kafka client settings; the latency ones are a budget for the <1 s loop.

    ``linger_ms`` 5 and ``fetch_max_wait_ms`` 20 take a produce->consume hop
    from ~500 ms (aiokafka defaults) to ~20 ms p99 on the embedded broker.
    """

    bootstrap_servers: str = "127.0.0.1:9092"
    partitions: int = Field(default=4, ge=1)
    replication_factor: int = Field(default=1, ge=1)
    linger_ms: int = Field(default=5, ge=0)
    fetch_max_wait_ms: int = Field(default=20, ge=1)
    request_timeout_ms: int = Field(default=10_000, ge=100)
    max_request_size: int = Field(default=8 * 1024 * 1024, ge=1024)
    # Real Kafka supports the idempotent producer; Tansu's memory storage refuses
    # InitProducerId, so it is a setting. Exactly-once effects come from pair_id dedupe.
    enable_idempotence: bool = False
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    sasl_mechanism: str | None = None
    sasl_username: str | None = None
    sasl_password: SecretStr | None = None
    ssl_cafile: Path | None = None
    ssl_certfile: Path | None = None
    ssl_keyfile: Path | None = None
    topics: TopicNames = TopicNames()


class RedisSettings(BaseModel):
    """Redis connection; ``url`` None means: find one or start one (embedded stack)."""

    url: str | None = None
    key_prefix: str = "qd:"
    password: SecretStr | None = None
    ssl_ca_certs: Path | None = None


DEV_KEY = "quantdrift-dev-key-change-me-loopback-only"
# HMAC-SHA256 keys shorter than its 32-byte output are guessable offline from one
# signed record; every key in the ring verifies, so every key must be this long.
MIN_SIGNING_KEY_BYTES = 32


class SigningSettings(BaseModel):
    """HMAC keys for RouteCommands, by key id, so keys rotate without downtime.

    A gateway accepts any key in ``keys``; the breaker signs with ``active_key_id``.
    The default key is for the embedded demo only; production sets its own.
    """

    active_key_id: str = "dev"
    keys: dict[str, SecretStr] = Field(default_factory=lambda: {"dev": SecretStr(DEV_KEY)})
    # A command older than this may only move users to the reference (replays of an
    # old restore are refused); one issued further than the skew in the future is refused.
    max_command_age_s: float = Field(default=300.0, gt=0)
    max_clock_skew_s: float = Field(default=30.0, ge=0)
    # Ed25519 (schemas/ed25519.py): documents that leave the project are signed with a
    # private key and checked with its public key alone, so a verifier cannot forge.
    # The private key (PEM) signs launch approvals and certificates (None: approvals
    # are HMAC with the active ring key, and no certificate can be issued).
    private_key_file: Path | None = None
    # Trusted public keys (PEM files): approvals and certificates they verify.
    public_keys: list[Path] = Field(default_factory=list)


class EmbeddingSettings(BaseModel):
    """The sentence embedder: a local path or a package-shipped model, never a hub."""

    model: str = "packaged:all-MiniLM-L6-v2"
    batch_size: int = Field(default=32, ge=1)
    threads: int = Field(default=1, ge=1)
    cache_size: int = Field(default=4096, ge=0)
    # MiniLM's weights and arithmetic: bfloat16 runs several times faster on a CPU with
    # native bf16 dot products (AVX512-BF16, AMX; the worker warns on one without) and
    # moves cosines by < 0.01 (bench/escalation_means.py, bench/decisions.py). Every
    # worker of a deployment should use the same, so a pair scores the same on any.
    dtype: Literal["float32", "bfloat16"] = "float32"
    # Which tier scores (quantdrift.embedding.factory): minilm on every pair,
    # tiered (static everywhere, MiniLM where it can change a decision),
    # static alone, or none.
    tier: Literal["minilm", "tiered", "static", "none"] = "tiered"
    static_model: str = "packaged:static-minilm"
    calibration: Path | None = None  # None: calibration.json beside the static model
    band: float | None = Field(default=None, ge=0)  # None: the calibration's band
    # The agreement sample (quantdrift.embedding.tiered.Escalation says why 1 in 400).
    sample_rate: float = Field(default=0.0025, ge=0, le=1)
    escalation_thresholds: tuple[float, ...] = Field(default=(0.88,), min_length=1)
    # A pair d band widths from a threshold escalates with probability min(1, rate / d),
    # drawn from its texts, so every worker escalates the same pairs
    # (quantdrift.embedding.tiered). None: every pair in the band; 0: none.
    escalation_rate: float | None = Field(default=0.005, ge=0, le=1)


class WorkerSettings(BaseModel):
    """Faust worker knobs; rebalance timeouts tuned so a worker joins in seconds."""

    app_id: str = "quantdrift"
    web_port: int = Field(default=6066, ge=0)
    # Loopback by default; compose sets 0.0.0.0 so Prometheus can scrape /metrics.
    web_bind: str = "127.0.0.1"
    batch_max: int = Field(default=64, ge=1)
    batch_within_s: float = Field(default=0.02, gt=0)
    broker_rebalance_timeout_s: float = 3.0
    broker_session_timeout_s: float = 10.0
    broker_heartbeat_interval_s: float = 1.0
    max_text_chars: int = Field(default=200_000, ge=1)
    # pair_id dedupe window: redeliveries come from offsets folded but not yet
    # committed, or a producer's retry, both seconds old; an hour bounds Redis to
    # about one small key per pair of the last hour (measured in the README).
    dedupe_ttl_s: int = Field(default=3600, ge=60)
    # How long a worker may hold a route's outbox while it publishes: longer than a
    # slow broker's ack, short enough that a crashed worker's commands go out soon
    # (gateways have the Redis copy meanwhile).
    outbox_claim_ttl_ms: int = Field(default=10_000, ge=100)
    # SIGTERM/SIGINT to exit: a clean stop commits offsets and leaves the group; past
    # this the worker exits anyway (a broker that is gone would hold it ~60 s). Under
    # Docker's 10 s grace, so the stop is never a SIGKILL; compose's stop_grace_period
    # must stay above it.
    stop_timeout_s: float = Field(default=8.0, gt=0)
    # A held partition with records waiting whose committed offset has not moved this long is
    # stalled (status/watchdog.py): logged with the consumer's state, /healthz fails. Also how
    # long a score the broker refuses is resent before the worker exits (streams/delivery.py).
    stall_after_s: float = Field(default=60.0, ge=4)
    # Test-only crash points (tests/faults): the worker SIGKILLs itself there.
    failpoints: tuple[str, ...] = ()


class AlertsSettings(BaseModel):
    """``alerts forward``'s secrets: never on argv, where ``ps`` shows them to every user.

    ``slack_webhook_url`` (env ``QUANTDRIFT_ALERTS__SLACK_WEBHOOK_URL``) or
    ``slack_webhook_file`` (a file holding the URL, e.g. a mounted secret).
    """

    slack_webhook_url: SecretStr | None = None
    slack_webhook_file: Path | None = None


class Settings(BaseSettings):
    """Every setting of quantdrift; env ``QUANTDRIFT_SECTION__FIELD``."""

    model_config = SettingsConfigDict(
        env_prefix="QUANTDRIFT_", env_nested_delimiter="__", frozen=True, extra="ignore"
    )

    kafka: KafkaSettings = KafkaSettings()
    redis: RedisSettings = RedisSettings()
    signing: SigningSettings = SigningSettings()
    embedding: EmbeddingSettings = EmbeddingSettings()
    worker: WorkerSettings = WorkerSettings()
    alerts: AlertsSettings = AlertsSettings()
    policy_file: Path | None = None
    hash_prompts: bool = False
    # The salt of the one prompt hash (schemas/privacy.py): the worker's DLQ, and the
    # gateway's when its config sets no prompt_salt. The same secret on both sides.
    prompt_salt: SecretStr = SecretStr("")


def _is_loopback(host: str) -> bool:
    host = host.strip().strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _bootstrap_hosts(servers: str) -> list[str]:
    hosts = []
    for entry in servers.split(","):
        entry = entry.strip()
        if "://" in entry:
            entry = entry.split("://", 1)[1]
        hosts.append(entry.rsplit(":", 1)[0] if entry.count(":") == 1 or "]" in entry else entry)
    return hosts


def require_safe_signing(settings: Settings, redis_url: str) -> None:
    """Refuse to run with no signing key, a short one, or the dev key beyond loopback.

    Every key of the ring must be at least ``MIN_SIGNING_KEY_BYTES`` (UTF-8) long:
    a gateway accepts any key in the ring, so one short key is enough to forge.

    The dev key is public (it is in this file): anyone could sign a rollback or a
    restore with it. It is fine for the embedded stack on loopback and nowhere
    else. Raises ConfigError with one line saying what to set.

    >>> require_safe_signing(Settings(), "redis://127.0.0.1:6379/0")
    >>> kafka = KafkaSettings(bootstrap_servers="kafka:9092")
    >>> require_safe_signing(Settings(kafka=kafka), "redis://127.0.0.1:6379/0")
    Traceback (most recent call last):
    ...
    quantdrift.errors.ConfigError: refusing to start: the built-in dev signing key ...
    """
    keys = settings.signing.keys
    if not keys:
        raise ConfigError(
            "refusing to start: no command signing key (set QUANTDRIFT_SIGNING__KEYS "
            "and QUANTDRIFT_SIGNING__ACTIVE_KEY_ID)"
        )
    for key_id, secret in keys.items():
        size = len(secret.get_secret_value().encode("utf-8"))
        if size < MIN_SIGNING_KEY_BYTES:
            raise ConfigError(
                f"refusing to start: signing key {key_id!r} is {size} bytes, "
                f"needs at least {MIN_SIGNING_KEY_BYTES} (set QUANTDRIFT_SIGNING__KEYS to "
                "random keys, e.g. from `openssl rand -hex 32`)"
            )
    uses_dev = any(v.get_secret_value() == DEV_KEY for v in keys.values())
    if not uses_dev:
        return
    hosts = _bootstrap_hosts(settings.kafka.bootstrap_servers)
    hosts.append(urlsplit(redis_url).hostname or "")
    remote = [h for h in hosts if not _is_loopback(h)]
    if remote:
        raise ConfigError(
            f"refusing to start: the built-in dev signing key is only for loopback, "
            f"and {remote[0]} is not (set QUANTDRIFT_SIGNING__KEYS and "
            "QUANTDRIFT_SIGNING__ACTIVE_KEY_ID to your own keys)"
        )


def configured_redis_url(settings: Settings) -> str:
    """The Redis this process was configured with; never a guess.

    Falling back to whatever answers on :6379 once made a command read and write
    another stack's breaker state without a word, so no URL is an error.
    """
    if not settings.redis.url:
        raise ConfigError(
            "no Redis configured: set QUANTDRIFT_REDIS__URL, or run `quantdrift stack up` "
            "in this directory"
        )
    return settings.redis.url
