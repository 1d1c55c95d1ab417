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
import json
import os
import sys
from pathlib import Path
from typing import Any

from quantdrift.cli.common import (
    add_log_level,
    load_settings,
    redis_url,
    signing_settings,
    with_stack,
)


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


def build_gateway(config_path: Path, *, control: bool = True):  # type: ignore[no-untyped-def]
    """The Gateway from a config file and the environment's settings."""
    from quantdrift.gateway.app import DegradationPublisher, Gateway
    from quantdrift.gateway.controller import RouteController
    from quantdrift.gateway.gateway_config import load_config
    from quantdrift.gateway.publisher import ShadowPublisher
    from quantdrift.gateway.targets import resolver_for
    from quantdrift.schemas.signing import verifier_from_settings

    config = with_env_keys(load_config(config_path), os.environ)
    settings = signing_settings(with_stack(load_settings()))
    if not config.prompt_salt and settings.prompt_salt.get_secret_value():
        config = config.model_copy(update={"prompt_salt": settings.prompt_salt.get_secret_value()})
    publisher = ShadowPublisher(
        settings.kafka,
        config.shadow_sample_rate,
        queue_size=config.shadow_queue,
        hash_prompts=settings.hash_prompts,
    )
    controller = None
    if control:
        controller = RouteController(
            settings.kafka,
            redis_url(settings),
            verifier_from_settings(
                settings.signing.keys,
                settings.signing.max_command_age_s,
                settings.signing.max_clock_skew_s,
            ),
            key_prefix=settings.redis.key_prefix,
            routes=config.routes,
            resolve=resolver_for(config),
        )
    from quantdrift.preflight.signoff import key_ring

    return Gateway(
        config,
        publisher=publisher,
        degradations=DegradationPublisher(settings.kafka),
        controller=controller,
        preflight_keys=key_ring(settings.signing)[1],
    )


ENV_KEYS = "QUANTDRIFT_GATEWAY__API_KEYS"
OLD_ENV_KEYS = "QUANTDRIFT_GATEWAY_API_KEYS"  # before every variable was SECTION__FIELD
# Seconds open HTTP requests get after SIGTERM before uvicorn closes them.
GRACEFUL_S = 2


def with_env_keys(config: Any, environ: Any) -> Any:
    """``config`` with the API keys of ``QUANTDRIFT_GATEWAY__API_KEYS`` added (hashes only).

    The old name is read when the new one is unset (``load_settings`` warns about it).
    """
    from quantdrift.errors import ConfigError
    from quantdrift.gateway.gateway_config import parse_config

    raw = environ.get(ENV_KEYS) or environ.get(OLD_ENV_KEYS)
    if not raw:
        return config
    try:
        keys = json.loads(raw)
    except ValueError as exc:
        raise ConfigError(f"{ENV_KEYS}: not JSON ({exc})") from exc
    if not isinstance(keys, list):
        raise ConfigError(f"{ENV_KEYS}: expected a JSON list of keys")
    data = config.model_dump()
    auth = data.get("auth") or {"keys": []}
    auth["keys"] = [*auth.get("keys", []), *keys]
    return parse_config({**data, "auth": auth})


def run(args: argparse.Namespace) -> int:
    if not 0 < args.port < 65536:
        sys.stderr.write(f"quantdrift: error: --port must be in 1..65535, got {args.port}\n")
        return 2
    import asyncio

    import uvicorn

    from quantdrift.gateway.app import create_admin_app, create_app

    gateway = build_gateway(args.config, control=not args.no_control)
    # Open requests get this long after SIGTERM; then the lifespan drains shadow jobs
    # (shadow_drain_s) and the publisher. Keep stop_grace_period above the sum.
    grace = GRACEFUL_S
    api = uvicorn.Server(
        uvicorn.Config(
            create_app(gateway),
            host=args.host,
            port=args.port,
            log_level=args.log_level,
            timeout_graceful_shutdown=grace,
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
                )
            )
        )

    async def serve() -> None:
        await asyncio.gather(*(s.serve() for s in servers))

    asyncio.run(serve())
    return 0
