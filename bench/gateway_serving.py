"""The gateway benches' shared setup: a Gateway on uvicorn in this process, its
publisher pointed at a broker that is not there (the drop path: pairs are offered,
counted and dropped, so the broker's speed is not part of the figure)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import uvicorn

from quantdrift.config import KafkaSettings
from quantdrift.gateway.http.app import create_app
from quantdrift.gateway.http.service import Gateway
from quantdrift.gateway.shadow.publisher import ShadowPublisher
from quantdrift.stack import free_port


def quiet_logs() -> None:
    """Errors only: the dead broker's reconnect warnings would bury a bench's output."""
    logging.basicConfig(level=logging.ERROR)
    logging.getLogger("quantdrift").setLevel(logging.ERROR)
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)


def dead_broker_publisher() -> ShadowPublisher:
    dead = KafkaSettings(bootstrap_servers=f"127.0.0.1:{free_port()}")
    return ShadowPublisher(dead, 1.0, queue_size=1000, topic="quantdrift.bench.pairs")


@asynccontextmanager
async def serving(gateway: Gateway) -> AsyncIterator[str]:
    """The gateway's base URL while it serves on a free loopback port."""
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(create_app(gateway), host="127.0.0.1", port=port, log_level="critical")
    )
    server.install_signal_handlers = lambda: None  # type: ignore[method-assign]
    task = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task
