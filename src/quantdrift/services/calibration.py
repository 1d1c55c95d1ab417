"""Calibrate: a route's noise floor and blessed baseline, scored as the worker scores,
written where the worker reads them.

``quantdrift calibrate`` parses and prints; this does the job. The pairs come from a
file or from a range of a live topic (the route's own noise and shadow pairs, as the
gateway published them, read by :func:`quantdrift.services.pairs.read_topic`, the
reader replay uses). Noise pairs (reference vs reference) seed each decoding mode's
floor, from that mode's pairs only; shadow pairs of a blessed candidate
(:func:`~quantdrift.evaluation.modes.select` names it by label, precision, served
model or engine identity) add the blessed baseline. Every floor goes through the
``BreakerStore`` protocol's ``seed_floor``, the call eval makes on its memory store,
here on Redis.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import redis.asyncio as aioredis

from quantdrift.breaker.policy import load_policy
from quantdrift.breaker.protocol import BreakerStore
from quantdrift.breaker.store import RedisBreakerStore
from quantdrift.config import Settings, configured_redis_url
from quantdrift.errors import InputError
from quantdrift.evaluation import ScoreCache
from quantdrift.evaluation.calibration import seed_from_pairs
from quantdrift.evaluation.modes import select
from quantdrift.schemas import PairEvent
from quantdrift.schemas.signing import signer_from_settings
from quantdrift.services.pairs import read_pairs, read_topic
from quantdrift.services.scoring import build_embedder

if TYPE_CHECKING:
    from quantdrift.replay.sources import TopicRange

Seeds = dict[str, tuple[dict[str, list[dict[str, float]]], dict[str, str]]]


@dataclass(frozen=True, slots=True)
class CalibrationRequest:
    """What to calibrate: a file (``pairs``) or a topic range (``topic``, "" for the
    settings' pairs topic, and ``range``), the routes (none: each pair's own), the
    blessed candidates, the prompt part, replace or merge, and the scorer tier (None:
    the worker's).

    A file's pairs calibrate every route named (the lab's ``lab/noise`` pairs for a
    gateway's ``cs-agent/int4``); a topic holds live routes, so from a topic each route
    named calibrates from its own pairs only.
    """

    pairs: Path | None = None
    routes: Sequence[str] = ()
    blessed: Sequence[str] = ()
    part: Literal["calibration", "evaluation"] | None = None
    merge: bool = False
    embedder: str | None = None
    topic: str | None = None
    range: TopicRange | None = None
    timeout: float = 60.0

    def __post_init__(self) -> None:
        if self.pairs is None and self.topic is None:
            raise InputError("calibrate needs a pairs file or a topic (--topic)")
        if self.pairs is not None and self.topic is not None:
            raise InputError("calibrate from a pairs file or from a topic (--topic), not both")
        if any(not r for r in self.routes):
            raise InputError("--route must not be empty")
        if self.timeout <= 0:
            raise InputError(f"--timeout-s must be > 0, got {self.timeout:g}")


def calibrate(
    settings: Settings,
    request: CalibrationRequest,
    redis_url: str | None = None,
    key_prefix: str | None = None,
    progress: Callable[..., None] | None = None,
    warn: Callable[[str], None] | None = None,
) -> list[dict[str, object]]:
    """Score the noise and blessed pairs and write each floor; one row per floor.

    An InputError when the input holds neither (for a route named from a topic: none
    of its own), so nothing is written. ``warn`` hears of unreadable records on the
    topic, which are skipped. Redis is the given URL, else the configured one (never
    a guess), looked up only once there is something to write; the prefix is the
    given one, else the settings'.
    """
    policy = load_policy(settings.policy_file)
    everything, source = _read(settings, request, progress, warn)
    pairs = select(everything, part=request.part)
    noise = [p for p in pairs if p.kind == "noise"]
    labels = tuple(request.blessed)
    blessed = select(pairs, labels=labels, kinds=("shadow",)) if labels else []
    if not noise and not blessed:
        raise InputError(f"{source}: no noise pairs (kind = noise) or blessed pairs")
    own = request.topic is not None or not request.routes
    routes = request.routes or dict.fromkeys(p.route for p in [*noise, *blessed])
    if own and (bare := [r for r in routes if not any(p.route == r for p in [*noise, *blessed])]):
        raise InputError(
            f"{source}: no noise pairs (kind = noise) or blessed pairs of route "
            f"{', '.join(bare)}; nothing written"
        )
    embedder, _tier = build_embedder(settings.embedding, request.embedder)
    cache = ScoreCache(embedder, progress=progress)
    cache.fill([*noise, *blessed])
    seeds: Seeds = {}
    for route in routes:
        rp = policy.for_route(route)
        mine = [p for p in noise if p.route == route] if own else noise
        good = [p for p in blessed if p.route == route] if own else blessed
        seeds[route] = seed_from_pairs(mine, good, cache, rp, route)
    url = redis_url or configured_redis_url(settings)
    prefix = key_prefix if key_prefix is not None else settings.redis.key_prefix
    return asyncio.run(_write(url, prefix, settings, seeds, request.merge))


def _read(
    settings: Settings,
    request: CalibrationRequest,
    progress: Callable[..., None] | None,
    warn: Callable[[str], None] | None,
) -> tuple[list[PairEvent], str]:
    """The pairs to calibrate from, and where they came from (for messages); from a
    topic, only the range's pairs of the routes named (:func:`route_pairs`)."""
    if request.pairs is not None:
        if not request.pairs.exists():
            raise InputError(f"no such file: {request.pairs}")
        return read_pairs(request.pairs), str(request.pairs)
    # Deferred: aiokafka is loaded only when a topic is read.
    from quantdrift.replay.sources import TopicRange, split_records

    rng = request.range or TopicRange()
    lines, where = read_topic(settings, request.topic, rng, request.timeout, progress)
    records = split_records(lines, rng.since, rng.until)
    source = f"{where}, {rng.describe()}"
    if records.skipped and warn is not None:
        warn(f"{source}: skipped {len(records.skipped)} unreadable records ({records.skipped[0]})")
    if not records.pairs:
        why = f"{len(records.skipped)} unreadable records" if records.skipped else "no pairs"
        raise InputError(f"nothing to calibrate from {source}: {why} in the range")
    return route_pairs(records.pairs, request.routes, source), source


def route_pairs(pairs: Iterable[PairEvent], routes: Sequence[str], source: str) -> list[PairEvent]:
    """The pairs of ``routes`` (of every route when none is named), each ``pair_id`` once:
    a pair redelivered on the topic is one pair, as the worker counts it.

    >>> from quantdrift.schemas import ModelOutput
    >>> def pair(i, route):
    ...     out = ModelOutput(text="a")
    ...     return PairEvent(pair_id=f"p{i}", ts=0.0, route=route, candidate=out, reference=out)
    >>> topic = [pair(1, "a/int4"), pair(1, "a/int4"), pair(2, "b/int4")]
    >>> [p.pair_id for p in route_pairs(topic, ["a/int4"], "topic t")]
    ['p1']
    >>> [p.pair_id for p in route_pairs(topic, [], "topic t")]
    ['p1', 'p2']
    """
    seen: dict[str, PairEvent] = {}
    held: set[str] = set()
    for p in pairs:
        held.add(p.route)
        if not routes or p.route in routes:
            seen.setdefault(p.pair_id, p)
    if not seen:
        raise InputError(
            f"nothing to calibrate from {source}: no pairs of route {', '.join(routes)} "
            f"in the range (it holds {', '.join(sorted(held)) or 'no pairs'})"
        )
    return list(seen.values())


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
                        "sha256": state.sha256(),
                    }
                )
    finally:
        await client.aclose()
    return rows
