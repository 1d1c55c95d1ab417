"""``quantdrift gateway --config gateway.yaml [--port P]``: the reference gateway.

Serves ``/v1/chat/completions`` and ``/v1/models`` (OpenAI-compatible), ``/health``
and ``/metrics`` in front of the precision pools of the config file; Kafka, Redis
and signing keys come from the settings (``QUANTDRIFT_*``, or a running
``quantdrift stack up``). API keys may also come from the environment:
``QUANTDRIFT_GATEWAY__API_KEYS`` holds a JSON list of ``{"name", "sha256",
"routes", "high_precision"}`` entries, added to the config's ``auth.keys`` (so a
secret store can inject them without editing the file). The old name
``QUANTDRIFT_GATEWAY_API_KEYS`` still works, with a warning.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from quantdrift.cli.common import add_log_level, load_settings, signing_settings, with_stack

# Seconds open HTTP requests get after SIGTERM before uvicorn closes them.
GRACEFUL_S = 2


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("gateway", help="OpenAI-compatible gateway with shadow dual-run and guards")
    p.add_argument("--config", type=Path, required=True, help="gateway YAML (see examples/)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument(
        "--no-control", action="store_true", help="do not follow RouteCommands (no Redis/Kafka)"
    )
    add_log_level(p, "info")
    p.set_defaults(func=run, service=True)


def run(args: argparse.Namespace) -> int:
    if not 0 < args.port < 65536:
        sys.stderr.write(f"quantdrift: error: --port must be in 1..65535, got {args.port}\n")
        return 2
    import asyncio

    import uvicorn

    from quantdrift.gateway.app import create_admin_app, create_app
    from quantdrift.gateway.lingering import lingering_protocol
    from quantdrift.services.gateway import build_gateway

    settings = signing_settings(with_stack(load_settings()))
    gateway = build_gateway(args.config, settings, control=not args.no_control, environ=os.environ)
    # Open requests get this long after SIGTERM; then the lifespan drains shadow jobs
    # (shadow_drain_s) and the publisher. Keep stop_grace_period above the sum.
    grace = GRACEFUL_S
    # A client still sending a body the gateway answered early reads the answer.
    http = lingering_protocol(gateway.on_linger)
    api = uvicorn.Server(
        uvicorn.Config(
            create_app(gateway),
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

    async def serve() -> None:
        await asyncio.gather(*(s.serve() for s in servers))

    asyncio.run(serve())
    return 0
