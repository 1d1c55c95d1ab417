"""Kafka clients' settings from ``KafkaSettings``: one place for TLS, SASL and latency.

Every client the project builds (the gateway's producer and control follower,
the worker's Faust app, the alert forwarder, the CLI's readers) takes its
arguments from here: ``producer_kwargs`` / ``consumer_kwargs`` for aiokafka,
``faust_credentials`` for Faust, so TLS and SASL/SCRAM are set once
(``QUANTDRIFT_KAFKA__SECURITY_PROTOCOL`` and friends, see docs/security.md).

Latency is a budget. The guard loop (pair -> score -> judge -> command ->
gateway) must close in well under a second, and every Kafka hop spends part
of it. aiokafka's defaults are tuned for throughput, not for this:

* ``linger_ms`` 5 (aiokafka's default is 0; the Java client's is 5 since
  Kafka 4.0): a producer waits at most 5 ms to fill a batch. Shadow pairs arrive in
  bursts, so 5 ms buys real batching for a cost no user sees (the publisher is
  off the request path) and the command path pays it once.
* ``fetch_max_wait_ms`` 20 (default 500): when a partition has no new data the
  broker holds the fetch this long before answering empty. With 500 ms a
  command that lands just after an empty fetch waits half a second before the
  gateway even asks again; with 20 ms a produce->consume hop is ~20 ms p99 on
  the embedded broker, at the price of ~50 cheap empty fetches per second per
  idle consumer.

``acks="all"`` always: a rollback command or a pair acknowledged by only one
replica can vanish with that broker, and the guard would never know.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

from aiokafka.errors import KafkaError
from aiokafka.helpers import create_ssl_context

from quantdrift.config import KafkaSettings
from quantdrift.errors import BrokerError, ConfigError

# aiokafka's own default for a partition's fetch; raised to max_request_size so a
# large pair (a long looping output) never wedges a consumer behind it.
_DEFAULT_PARTITION_FETCH = 1024 * 1024


SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")


def _security_kwargs(k: KafkaSettings) -> dict[str, Any]:
    """TLS and SASL settings, passed through; inconsistent ones are a ConfigError."""
    kwargs: dict[str, Any] = {"security_protocol": k.security_protocol}
    if k.security_protocol in ("PLAINTEXT", "SSL") and (k.sasl_mechanism or k.sasl_username):
        raise ConfigError(
            f"kafka.sasl_* is set but kafka.security_protocol is {k.security_protocol}: "
            "set SASL_SSL (or SASL_PLAINTEXT) so the credentials are used"
        )
    if k.security_protocol in ("SSL", "SASL_SSL"):
        if k.ssl_keyfile is not None and k.ssl_certfile is None:
            raise ConfigError("kafka.ssl_keyfile is set without kafka.ssl_certfile")
        for name in ("ssl_cafile", "ssl_certfile", "ssl_keyfile"):
            path = getattr(k, name)
            if path is not None and not path.is_file():
                raise ConfigError(f"kafka.{name} {path} is not a readable file")
        # No cafile: the system's CAs, which is what a managed Kafka with a public CA needs.
        kwargs["ssl_context"] = create_ssl_context(
            cafile=str(k.ssl_cafile) if k.ssl_cafile else None,
            certfile=str(k.ssl_certfile) if k.ssl_certfile else None,
            keyfile=str(k.ssl_keyfile) if k.ssl_keyfile else None,
        )
    if k.security_protocol in ("SASL_PLAINTEXT", "SASL_SSL"):
        mechanism = k.sasl_mechanism or "PLAIN"
        if mechanism not in SASL_MECHANISMS:
            raise ConfigError(
                f"kafka.sasl_mechanism {mechanism!r} is not one of {', '.join(SASL_MECHANISMS)}"
            )
        kwargs["sasl_mechanism"] = mechanism
        if not k.sasl_username or k.sasl_password is None:
            raise ConfigError(
                f"kafka.sasl_mechanism {mechanism} needs sasl_username and sasl_password"
            )
        # aiokafka uses the "plain" names for SCRAM too.
        kwargs["sasl_plain_username"] = k.sasl_username
        kwargs["sasl_plain_password"] = k.sasl_password.get_secret_value()
    return kwargs


def faust_credentials(k: KafkaSettings) -> Any:
    """The same TLS/SASL settings as Faust ``broker_credentials`` (None for PLAINTEXT).

    Faust turns these back into the very aiokafka arguments ``_security_kwargs``
    builds (``credentials_to_aiokafka_auth``); a test holds the two equal.
    """
    kwargs = _security_kwargs(k)  # validates, and builds the SSL context once
    if k.security_protocol == "PLAINTEXT":
        return None
    # Deferred: faust only in the worker; the gateway and the CLI never load it.
    from faust.auth import SASLCredentials, SSLCredentials

    ssl_context = kwargs.get("ssl_context")
    if k.security_protocol == "SSL":
        return SSLCredentials(ssl_context)
    return SASLCredentials(
        username=kwargs["sasl_plain_username"],
        password=kwargs["sasl_plain_password"],
        ssl_context=ssl_context,
        mechanism=kwargs["sasl_mechanism"],
    )


def producer_kwargs(k: KafkaSettings) -> dict[str, Any]:
    """Keyword arguments for ``AIOKafkaProducer``: acks=all, the latency budget, TLS/SASL."""
    return {
        "bootstrap_servers": k.bootstrap_servers,
        "acks": "all",
        "linger_ms": k.linger_ms,
        "enable_idempotence": k.enable_idempotence,
        "max_request_size": k.max_request_size,
        "request_timeout_ms": k.request_timeout_ms,
        **_security_kwargs(k),
    }


def consumer_kwargs(k: KafkaSettings) -> dict[str, Any]:
    """Keyword arguments for ``AIOKafkaConsumer`` (no group settings: callers choose those)."""
    partition_fetch = max(_DEFAULT_PARTITION_FETCH, k.max_request_size)
    return {
        "bootstrap_servers": k.bootstrap_servers,
        "fetch_max_wait_ms": k.fetch_max_wait_ms,
        "max_partition_fetch_bytes": partition_fetch,
        "fetch_max_bytes": max(50 * 1024 * 1024, partition_fetch),
        "request_timeout_ms": k.request_timeout_ms,
        **_security_kwargs(k),
    }


def reader_kwargs(consumer_options: Mapping[str, Any], group_id: str | None) -> dict[str, Any]:
    """``consumer_options`` for a consumer that reads from the earliest offset and commits
    only what its caller says is safe (``group_id`` None: no group, nothing committed).

    Every reader of recorded topics wants this: a page or a record must never be
    skipped because aiokafka committed an offset before the caller was done with it.

    >>> reader_kwargs({"bootstrap_servers": "b:9092"}, "qd-alerts")["enable_auto_commit"]
    False
    """
    return {
        **consumer_options,
        "group_id": group_id,
        "enable_auto_commit": False,
        "auto_offset_reset": "earliest",
    }


async def start_client(client: Any, bootstrap: str) -> None:
    """Start an aiokafka consumer or producer; if that fails, close it and raise BrokerError.

    A client whose ``start()`` failed still holds sockets and a background task:
    without the ``stop()`` Python prints "Unclosed AIOKafkaConsumer" at exit, under
    the one line the command line gives for an unreachable broker.
    """
    try:
        await client.start()
    except (KafkaError, OSError) as exc:
        with contextlib.suppress(Exception):
            await client.stop()
        raise BrokerError(
            f"cannot reach the Kafka broker at {bootstrap} ({type(exc).__name__}); is it "
            "running? set QUANTDRIFT_KAFKA__BOOTSTRAP_SERVERS or run `quantdrift stack up`"
        ) from exc
