"""What ``quantdrift gateway`` and ``quantdrift collector`` share: their options, and
building the parts from ``--config`` and the settings and serving them with uvicorn."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import uvicorn

from quantdrift.cli.settings import load_settings, signing_settings, with_stack
from quantdrift.gateway.http.app import create_admin_app
from quantdrift.gateway.http.lingering import lingering_protocol
from quantdrift.services.gateway import build_gateway

if TYPE_CHECKING:
    from quantdrift.gateway.http.service import Gateway

# Seconds open HTTP requests get after SIGTERM before uvicorn closes them.
GRACEFUL_S = 2


def serve(
    args: argparse.Namespace, create: Callable[[Gateway], Any], *, collector: bool = False
) -> int:
    """Build the parts from ``--config`` and the settings, serve ``create(parts)`` on
    ``--host:--port`` (and ``/health``, ``/metrics`` on ``admin_listen`` when set)."""
    if not 0 < args.port < 65536:
        sys.stderr.write(f"quantdrift: error: --port must be in 1..65535, got {args.port}\n")
        return 2
    settings = signing_settings(with_stack(load_settings()))
    gateway = build_gateway(
        args.config,
        settings,
        control=not args.no_control,
        environ=os.environ,
        collector=collector,
    )
    # Open requests get this long after SIGTERM; then the lifespan drains shadow jobs
    # (shadow_drain_s) and the publisher. Keep stop_grace_period above the sum.
    grace = GRACEFUL_S
    # A client still sending a body the gateway answered early reads the answer.
    http = lingering_protocol(gateway.on_linger)
    api = uvicorn.Server(
        uvicorn.Config(
            create(gateway),
            host=args.host,
            port=args.port,
            log_level=args.log_level,
            timeout_graceful_shutdown=grace,
            http=http,
        )
    )
    servers = [api]
    if gateway.config.admin_listen:
        host, _, port = gateway.config.admin_listen.rpartition(":")
        servers.append(
            uvicorn.Server(
                uvicorn.Config(
                    create_admin_app(gateway),
                    host=host,
                    port=int(port),
                    log_level=args.log_level,
                    lifespan="off",
                    timeout_graceful_shutdown=grace,
                    http=http,
                )
            )
        )

    async def serve_all() -> None:
        await asyncio.gather(*(s.serve() for s in servers))

    asyncio.run(serve_all())
    return 0
