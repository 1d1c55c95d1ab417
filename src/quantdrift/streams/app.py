"""The Faust app: topics and settings. Agents are attached in ``agents.py``.

Every hop's latency setting is chosen for the <1 s decisive-pair-to-switch
budget: producers linger 5 ms, consumers wait at most ``fetch_max_wait_ms``
(20 ms) for records, rebalances settle in ~3 s instead of Faust's ~30 s.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import faust
from faust.auth import SASLCredentials, SSLCredentials

from quantdrift.config import KafkaSettings, Settings
from quantdrift.kafka_clients import consumer_kwargs
from quantdrift.streams import transport


@dataclass
class Topics:
    pairs: faust.TopicT
    scores: faust.TopicT
    control: faust.TopicT
    alerts: faust.TopicT
    dlq: faust.TopicT
    degradations: faust.TopicT


def broker_credentials(k: KafkaSettings) -> Any:
    """Kafka TLS/SASL settings as Faust credentials (None for PLAINTEXT)."""
    if k.security_protocol == "PLAINTEXT":
        return None
    kwargs = consumer_kwargs(k)  # validates, and builds the SSL context once
    ssl_context = kwargs.get("ssl_context")
    if k.security_protocol == "SSL":
        return SSLCredentials(ssl_context)
    return SASLCredentials(
        username=kwargs.get("sasl_plain_username"),
        password=kwargs.get("sasl_plain_password"),
        ssl_context=ssl_context,
        mechanism=kwargs.get("sasl_mechanism", "PLAIN"),
    )


def create_app(settings: Settings, web_port: int | None = None) -> tuple[faust.App, Topics]:
    """A Faust app whose topics carry raw bytes: parsing is ours, so bad bytes reach the DLQ."""
    k, w = settings.kafka, settings.worker
    scheme = transport.register(k.fetch_max_wait_ms)
    brokers = ";".join(f"{scheme}://{b.strip()}" for b in k.bootstrap_servers.split(","))
    port = w.web_port if web_port is None else web_port
    app = faust.App(
        w.app_id,
        broker=brokers,
        store="memory://",
        topic_partitions=k.partitions,
        topic_replication_factor=k.replication_factor,
        topic_disable_leader=True,
        producer_linger=k.linger_ms / 1000.0,
        producer_acks=-1,
        producer_max_request_size=k.max_request_size,
        producer_request_timeout=k.request_timeout_ms / 1000.0,
        consumer_max_fetch_size=max(k.max_request_size * 2, 16 * 1024 * 1024),
        consumer_auto_offset_reset="earliest",
        broker_rebalance_timeout=w.broker_rebalance_timeout_s,
        broker_session_timeout=w.broker_session_timeout_s,
        broker_heartbeat_interval=w.broker_heartbeat_interval_s,
        broker_request_timeout=max(30.0, w.broker_session_timeout_s + 5),
        broker_commit_interval=0.5,
        stream_wait_empty=False,
        broker_credentials=broker_credentials(k),
        web_enabled=port > 0,
        web_port=port if port > 0 else 6066,
        # Containers set 0.0.0.0 so Prometheus can scrape /metrics (status page, issue 5).
        web_bind=getattr(w, "web_bind", "127.0.0.1"),
        web_in_thread=False,
    )
    t = k.topics

    def topic(name: str) -> faust.TopicT:
        return app.topic(
            name, key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw"
        )

    return app, Topics(
        topic(t.pairs),
        topic(t.scores),
        topic(t.control),
        topic(t.alerts),
        topic(t.dlq),
        topic(t.degradations),
    )
