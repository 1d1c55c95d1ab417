"""The gateway's composition root: config file plus settings -> a :class:`Gateway`.

The collector (``quantdrift collector``) is built here too: the same parts from the
same config file, served by ``gateway/foreign/collector.py`` instead of ``gateway/http/app.py``.

``quantdrift gateway`` calls it after reading the environment, and tests call it
with their own settings, so both build the same object the same way.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from pathlib import Path

from quantdrift.config import Settings, configured_redis_url
from quantdrift.errors import ConfigError
from quantdrift.gateway.chain.slices import DIMENSIONS
from quantdrift.gateway.control.controller import RouteController
from quantdrift.gateway.control.evidence import EvidenceWatch
from quantdrift.gateway.control.floors import FloorWatch
from quantdrift.gateway.control.spend_report import SpendReport
from quantdrift.gateway.control.targets import resolver_for
from quantdrift.gateway.foreign.follower import NginxFollower, reload_argv
from quantdrift.gateway.gateway_config import GatewayConfig, load_config, parse_config
from quantdrift.gateway.http.service import Gateway
from quantdrift.gateway.shadow.publisher import DegradationPublisher, ShadowPublisher
from quantdrift.schemas.signing import verifier_from_settings
from quantdrift.schemas.signoff import trusted

ENV_KEYS = "QUANTDRIFT_GATEWAY__API_KEYS"
OLD_ENV_KEYS = "QUANTDRIFT_GATEWAY_API_KEYS"  # before every variable was SECTION__FIELD


def build_gateway(
    config_path: Path,
    settings: Settings,
    *,
    control: bool = True,
    environ: Mapping[str, str] | None = None,
    collector: bool = False,
) -> Gateway:
    """The Gateway from a config file, the settings, and API keys from ``environ``.

    ``collector``: the parts for ``quantdrift collector`` (``gateway/foreign/collector.py``): the
    same, with the pairs' sample rate scaled by the config's ``collector.mirrored_share``.
    """
    config = with_env_keys(load_config(config_path), environ or {})
    if not config.prompt_salt and settings.prompt_salt.get_secret_value():
        config = config.model_copy(update={"prompt_salt": settings.prompt_salt.get_secret_value()})
    publisher = ShadowPublisher(
        settings.kafka,
        config.shadow_sample_rate,
        queue_size=config.shadow_queue,
        hash_prompts=settings.hash_prompts,
    )
    controller = floors = evidence = spend_report = None
    if control:
        redis_url, prefix = configured_redis_url(settings), settings.redis.key_prefix
        floors = FloorWatch(config, redis_url, prefix)
        evidence = EvidenceWatch(config, redis_url, prefix)
        spend_report = SpendReport(config, redis_url, prefix)
        controller = build_controller(config, settings)
    return Gateway(
        config,
        publisher=publisher,
        degradations=DegradationPublisher(settings.kafka),
        controller=controller,
        preflight_keys=trusted(settings.signing),
        floors=floors,
        evidence=evidence,
        spend_report=spend_report,
        mirrored_share=config.collector.mirrored_share if collector else 1.0,
    )


def build_controller(
    config: GatewayConfig, settings: Settings, *, slices: bool = True
) -> RouteController:
    """The RouteController of a config's routes: the gateway's, the collector's and the
    nginx follower's, so all three verify commands alike (signature, epoch, freshness).

    ``slices``: whether this process holds a slice apart per request (the gateway and
    the collector tag every request); a follower that splits a route by weight cannot,
    and refuses (and counts) every slice-scoped command."""
    return RouteController(
        settings.kafka,
        configured_redis_url(settings),
        verifier_from_settings(
            settings.signing.keys,
            settings.signing.max_command_age_s,
            settings.signing.max_clock_skew_s,
        ),
        key_prefix=settings.redis.key_prefix,
        routes=config.routes,
        resolve=resolver_for(config),
        slice_dimensions=DIMENSIONS if slices else (),
    )


async def follow_nginx(
    config_path: Path,
    settings: Settings,
    upstream_file: Path,
    reload_cmd: str,
    *,
    names: Mapping[str, str] | None = None,
    once: bool = False,
) -> None:
    """``quantdrift follow nginx``: keep ``upstream_file`` on the routes' commands and
    reload nginx after each (or, ``once``, write it and return: before nginx starts)."""
    config = load_config(config_path)
    follower = NginxFollower(
        config,
        build_controller(config, settings, slices=False),
        upstream_file,
        reload_argv(reload_cmd),
        names=names,
    )
    if once:
        await follower.write_once()
        return
    await follower.start()
    try:
        await asyncio.Event().wait()  # until the process is stopped
    finally:
        await follower.stop()


def with_env_keys(config: GatewayConfig, environ: Mapping[str, str]) -> GatewayConfig:
    """``config`` with the API keys of ``QUANTDRIFT_GATEWAY__API_KEYS`` added (hashes only).

    The old name is read when the new one is unset (``load_settings`` warns about it).
    """
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
