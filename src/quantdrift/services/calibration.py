"""Calibrate: a route's noise floor and blessed baseline, scored as the worker scores,
written where the worker reads them.

``quantdrift calibrate`` parses and prints; this does the job. Noise pairs
(reference vs reference) seed each decoding mode's floor, from that mode's pairs
only; shadow pairs of a blessed candidate (:func:`~quantdrift.evaluation.modes.select`
names it by label, precision, served model or engine identity) add the blessed
baseline. Every floor goes through the ``BreakerStore`` protocol's ``seed_floor``,
the call eval makes on its memory store, here on Redis.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import redis.asyncio as aioredis

from quantdrift.breaker.policy import load_policy
from quantdrift.breaker.protocol import BreakerStore
from quantdrift.breaker.store import RedisBreakerStore
from quantdrift.config import Settings, configured_redis_url
from quantdrift.errors import InputError
from quantdrift.evaluation import ScoreCache
from quantdrift.evaluation.calibration import seed_from_pairs
from quantdrift.evaluation.modes import select
from quantdrift.schemas.signing import signer_from_settings
from quantdrift.services.pairs import read_pairs
from quantdrift.services.scoring import build_embedder

Seeds = dict[str, tuple[dict[str, list[dict[str, float]]], dict[str, str]]]


@dataclass(frozen=True, slots=True)
class CalibrationRequest:
    """What to calibrate: the file, the routes (none: each pair's own), the blessed
    candidates, the prompt part, replace or merge, and the scorer tier (None: the
    worker's)."""

    pairs: Path
    routes: Sequence[str] = ()
    blessed: Sequence[str] = ()
    part: Literal["calibration", "evaluation"] | None = None
    merge: bool = False
    embedder: str | None = None


def calibrate(
    settings: Settings,
    request: CalibrationRequest,
    redis_url: str | None = None,
    key_prefix: str | None = None,
    progress: Callable[..., None] | None = None,
) -> list[dict[str, object]]:
    """Score the file's noise and blessed pairs and write each floor; one row per floor.

    An InputError when the file holds neither, so nothing is written. Redis is the
    given URL, else the configured one (never a guess), looked up only once there is
    something to write; the prefix is the given one, else the settings'.
    """
    if not request.pairs.exists():
        raise InputError(f"no such file: {request.pairs}")
    if any(not r for r in request.routes):
        raise InputError("--route must not be empty")
    policy = load_policy(settings.policy_file)
    pairs = select(read_pairs(request.pairs), part=request.part)
    noise = [p for p in pairs if p.kind == "noise"]
    labels = tuple(request.blessed)
    blessed = select(pairs, labels=labels, kinds=("shadow",)) if labels else []
    if not noise and not blessed:
        raise InputError(f"{request.pairs}: no noise pairs (kind = noise) or blessed pairs")
    embedder, _tier = build_embedder(settings.embedding, request.embedder)
    cache = ScoreCache(embedder, progress=progress)
    cache.fill([*noise, *blessed])
    seeds: Seeds = {}
    for route in request.routes or dict.fromkeys(p.route for p in [*noise, *blessed]):
        rp = policy.for_route(route)
        mine = noise if request.routes else [p for p in noise if p.route == route]
        good = blessed if request.routes else [p for p in blessed if p.route == route]
        seeds[route] = seed_from_pairs(mine, good, cache, rp, route)
    url = redis_url or configured_redis_url(settings)
    prefix = key_prefix if key_prefix is not None else settings.redis.key_prefix
    return asyncio.run(_write(url, prefix, settings, seeds, request.merge))


async def _write(
    url: str, prefix: str, settings: Settings, seeds: Seeds, merge: bool
) -> list[dict[str, object]]:
    signer = signer_from_settings(settings.signing.active_key_id, settings.signing.keys)
    client = aioredis.Redis.from_url(url, socket_timeout=5)
    store: BreakerStore = RedisBreakerStore(client, signer, key_prefix=prefix)
    rows: list[dict[str, object]] = []
    try:
        for route, (seed, source) in seeds.items():
            for mode, values in seed.items():
                if not values:
                    continue
                state = await store.seed_floor(route, mode, values, merge=merge)
                rows.append(
                    {
                        "route": route,
                        "mode": mode,
                        "seeded": len(values),
                        "source": source[mode],
                        "floor_pairs": max((state.count(m) for m in state.values), default=0),
                    }
                )
    finally:
        await client.aclose()
    return rows
