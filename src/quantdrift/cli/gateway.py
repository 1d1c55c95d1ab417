"""``quantdrift gateway --config gateway.yaml [--port P]``: the reference gateway.

Serves ``/v1/chat/completions`` (OpenAI-compatible), ``/health`` and ``/metrics``
in front of the precision pools of the config file; Kafka, Redis and signing keys
come from the settings (``QUANTDRIFT_*``, or a running ``quantdrift stack up``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from quantdrift.cli.common import load_settings, redis_url, signing_settings, with_stack


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("gateway", help="OpenAI-compatible gateway with shadow dual-run and guards")
    p.add_argument("--config", type=Path, required=True, help="gateway YAML (see examples/)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument(
        "--no-control", action="store_true", help="do not follow RouteCommands (no Redis/Kafka)"
    )
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    p.set_defaults(func=run)


def build_gateway(config_path: Path, *, control: bool = True):  # type: ignore[no-untyped-def]
    """The Gateway from a config file and the environment's settings."""
    from quantdrift.gateway.controller import RouteController
    from quantdrift.gateway.gateway_config import load_config
    from quantdrift.gateway.publisher import ShadowPublisher
    from quantdrift.gateway.server import DegradationPublisher, Gateway
    from quantdrift.gateway.targets import resolver_for
    from quantdrift.schemas.signing import verifier_from_settings

    config = load_config(config_path)
    settings = signing_settings(with_stack(load_settings()))
    publisher = ShadowPublisher(
        settings.kafka,
        config.shadow_sample_rate,
        queue_size=config.shadow_queue,
        hash_prompts=settings.hash_prompts,
        salt=config.sample_salt,
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
    return Gateway(
        config,
        publisher=publisher,
        degradations=DegradationPublisher(settings.kafka),
        controller=controller,
    )


def run(args: argparse.Namespace) -> int:
    if not 0 < args.port < 65536:
        sys.stderr.write(f"quantdrift: error: --port must be in 1..65535, got {args.port}\n")
        return 2
    import uvicorn

    from quantdrift.gateway.server import create_app

    gateway = build_gateway(args.config, control=not args.no_control)
    uvicorn.run(create_app(gateway), host=args.host, port=args.port, log_level=args.log_level)
    return 0
