"""Kafka over TLS from settings alone: the aiokafka clients and a real worker (Faust).

Tansu speaks no TLS, so a TLS terminator stands in front of it (an asyncio proxy
with a certificate openssl makes for ``localhost``), and Tansu advertises the
proxy's address: every connection a client makes, bootstrap and partition leader
alike, goes through TLS. A plaintext client is refused at that address, so the
check can fail. SASL/SCRAM has no broker here; tests/unit/test_kafka_clients.py
pins what the clients are handed for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaConnectionError

from quantdrift.config import KafkaSettings
from quantdrift.demo import synthetic
from quantdrift.kafka_clients import consumer_kwargs, producer_kwargs
from quantdrift.stack import free_port, kafka_metadata_ok, resolve_tansu_bin
from quantdrift.stack.ports import stop_popen
from support.guard import isolated_settings, on_route, shadow_only, until_seen
from support.workers import start_worker

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


def make_cert(directory: Path) -> tuple[Path, Path]:
    key, cert = directory / "broker.key", directory / "broker.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost",
         "-keyout", str(key), "-out", str(cert)],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return cert, key


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, ssl.SSLError):
        pass
    finally:
        with contextlib.suppress(Exception):
            writer.close()


@contextlib.asynccontextmanager
async def tls_proxy(cert: Path, key: Path, port: int, upstream: int) -> AsyncIterator[None]:
    """TLS on ``port``, plaintext to ``upstream``: what a TLS listener looks like to clients."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", upstream)
        except OSError:
            writer.close()
            return
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))

    server = await asyncio.start_server(handle, "127.0.0.1", port, ssl=context)
    try:
        yield
    finally:
        server.close()


@contextlib.contextmanager
def tansu_advertising(proxy_port: int) -> Iterator[int]:
    """A Tansu on a free port that tells clients to connect to the proxy instead."""
    port = free_port()
    proc = subprocess.Popen(
        [resolve_tansu_bin(), "broker",
         "--listener-url", f"tcp://127.0.0.1:{port}",
         "--advertised-listener-url", f"tcp://localhost:{proxy_port}",
         "--storage-engine", "memory://tansu/"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        # A refused connect returns at once: wait on a deadline, not a number of tries.
        deadline = time.monotonic() + 60.0
        while not kafka_metadata_ok("127.0.0.1", port, timeout=0.5):
            assert proc.poll() is None, "tansu exited"
            if time.monotonic() > deadline:
                raise AssertionError("tansu did not answer Metadata within 60 s")
            time.sleep(0.1)
        yield port
    finally:
        stop_popen(proc, timeout=5.0)


async def create_topics_tls(kafka: KafkaSettings) -> None:
    kwargs = producer_kwargs(kafka)
    admin = AIOKafkaAdminClient(
        bootstrap_servers=kafka.bootstrap_servers,
        security_protocol=kwargs["security_protocol"],
        ssl_context=kwargs["ssl_context"],
    )
    await admin.start()
    try:
        names = kafka.topics.model_dump().values()
        await admin.create_topics([NewTopic(n, kafka.partitions, 1) for n in names])
    finally:
        await admin.close()


async def test_clients_and_a_worker_speak_tls_from_settings(  # type: ignore[no-untyped-def]
    stack, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cert, key = make_cert(tmp_path)
    proxy_port = free_port()
    with tansu_advertising(proxy_port) as broker_port:
        async with tls_proxy(cert, key, proxy_port, broker_port):
            base = isolated_settings(
                SimpleNamespace(bootstrap=f"localhost:{proxy_port}", redis_url=stack.redis_url),
                f"qdtest:{uuid.uuid4().hex}:",
            )
            kafka = base.kafka.model_copy(update={"security_protocol": "SSL", "ssl_cafile": cert})
            settings = base.model_copy(update={"kafka": kafka})

            # Plaintext at the TLS address is refused: the proxy really is TLS.
            plain = AIOKafkaProducer(
                bootstrap_servers=kafka.bootstrap_servers, request_timeout_ms=2000
            )
            with pytest.raises(KafkaConnectionError):
                await plain.start()
            await plain.stop()

            # aiokafka clients built from the settings: produce and read back.
            await create_topics_tls(kafka)
            producer = AIOKafkaProducer(**producer_kwargs(kafka))
            await producer.start()
            try:
                await producer.send_and_wait(kafka.topics.degradations, b"over-tls", key=b"k")
            finally:
                await producer.stop()
            consumer = AIOKafkaConsumer(
                kafka.topics.degradations,
                **consumer_kwargs(kafka),
                group_id=None,
                auto_offset_reset="earliest",
            )
            await consumer.start()
            try:
                record = await asyncio.wait_for(consumer.getone(), 20)
                assert record.value == b"over-tls"
            finally:
                await consumer.stop()

            # A real worker (Faust), TLS from its environment: scores and judges pairs.
            monkeypatch.setenv("QUANTDRIFT_KAFKA__SECURITY_PROTOCOL", "SSL")
            monkeypatch.setenv("QUANTDRIFT_KAFKA__SSL_CAFILE", str(cert))
            monkeypatch.setenv("QUANTDRIFT_EMBEDDING__TIER", "none")
            worker = start_worker(settings, stack.redis_url)
            try:
                route = "tls/int4"
                pairs = on_route(shadow_only(synthetic.healthy(route, seed=5), 3), route, "tls")
                producer = AIOKafkaProducer(**producer_kwargs(kafka))
                await producer.start()
                try:
                    for p in pairs:
                        await producer.send_and_wait(
                            kafka.topics.pairs, p.dumps(), key=route.encode()
                        )
                finally:
                    await producer.stop()
                await until_seen(settings, route, len(pairs), worker, timeout=120)
            finally:
                worker.stop()
