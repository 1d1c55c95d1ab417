"""Turn PairEvent files into per-route evaluation streams.

How the files are merged (``quantdrift eval``):

* **Stream routes** are the routes of the healthy file's shadow pairs, in
  first-seen order. Each stream is that route's healthy shadow pairs in file
  order (``repeat`` times over, with fresh pair ids), then its drifted ones.
* **Drifted shadow pairs** keep their route when it is a stream route; when
  the healthy file has exactly one route they are *re-routed onto it* (the
  lab's ``lab/int2-g64`` pairs become the drift of ``lab/int8``: the same
  route's candidate goes bad); otherwise they form a stream of their own with
  no healthy part.
* **Noise pairs** inside the healthy or drifted file feed the noise floor as
  they come (first pass only when repeated): the floor of their own route if
  it is a stream route, else of every stream route (the lab writes its noise
  pairs on ``lab/noise``, a gateway may mirror reference-vs-reference on one
  route for all).
* **Calibration pairs** (``--calibrate``) are the noise pairs of that file,
  seeded into every stream route's floor before the streams start.
* ``noise_as_shadow``: the healthy file's noise pairs are split in file order,
  the 1st, 3rd, 5th ... feed the floor and the 2nd, 4th ... are judged as
  shadow pairs, a candidate that *is* the reference: must never roll back.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from quantdrift.schemas import PairEvent

Phase = Literal["healthy", "drifted"]


@dataclass(frozen=True, slots=True)
class Step:
    """One pair as the judge of ``route`` sees it."""

    pair: PairEvent
    phase: Phase
    kind: Literal["shadow", "noise"]
    pair_id: str


@dataclass
class RouteStream:
    route: str
    steps: list[Step] = field(default_factory=list)
    healthy_pairs: int = 0
    drifted_pairs: int = 0

    def add(
        self, pair: PairEvent, phase: Phase, kind: Literal["shadow", "noise"], tag: str
    ) -> None:
        self.steps.append(Step(pair, phase, kind, f"{tag}:{pair.pair_id}"))
        if kind == "shadow":
            if phase == "healthy":
                self.healthy_pairs += 1
            else:
                self.drifted_pairs += 1


@dataclass(frozen=True, slots=True)
class EvalPlan:
    streams: tuple[RouteStream, ...]
    calibration: tuple[PairEvent, ...]
    notes: tuple[str, ...] = ()

    def pairs(self) -> list[PairEvent]:
        """Every distinct pair the plan needs scored (by identity)."""
        seen: dict[int, PairEvent] = {id(p): p for p in self.calibration}
        for stream in self.streams:
            for step in stream.steps:
                seen.setdefault(id(step.pair), step.pair)
        return list(seen.values())


def build_plan(
    healthy: Sequence[PairEvent],
    drifted: Sequence[PairEvent] = (),
    calibrate: Sequence[PairEvent] = (),
    *,
    repeat: int = 1,
    noise_as_shadow: bool = False,
) -> EvalPlan:
    """Per-route streams from the three files (see the module docstring for the rules)."""
    if repeat < 1:
        raise ValueError(f"repeat must be >= 1, got {repeat}")
    notes: list[str] = []
    healthy_noise = [p for p in healthy if p.kind == "noise"]
    held_out = healthy_noise[1::2] if noise_as_shadow else []
    held_ids = {id(p) for p in held_out}
    routes: dict[str, RouteStream] = {}
    for p in healthy:
        if p.kind == "shadow":
            routes.setdefault(p.route, RouteStream(p.route))
    if noise_as_shadow and not routes:
        for p in held_out:
            routes.setdefault(p.route, RouteStream(p.route))

    def shadow_target(route: str) -> RouteStream:
        if route in routes:
            return routes[route]
        if len(routes) == 1:
            return next(iter(routes.values()))
        routes[route] = RouteStream(route)
        notes.append(f"{route}: not a healthy route, judged as a stream of its own")
        return routes[route]

    def feed_noise(p: PairEvent, phase: Phase, tag: str) -> None:
        targets = [routes[p.route]] if p.route in routes else list(routes.values())
        for stream in targets:
            stream.add(p, phase, "noise", tag)

    for n in range(repeat):
        for i, p in enumerate(healthy):
            tag = f"h{n}-{i}"
            if id(p) in held_ids:
                shadow_target(p.route).add(p, "healthy", "shadow", tag)
            elif p.kind == "shadow":
                routes[p.route].add(p, "healthy", "shadow", tag)
            elif n == 0:
                feed_noise(p, "healthy", tag)
    rerouted: set[str] = set()
    for i, p in enumerate(drifted):
        tag = f"d-{i}"
        if p.kind == "noise":
            feed_noise(p, "drifted", tag)
            continue
        stream = shadow_target(p.route)
        if stream.route != p.route:
            rerouted.add(p.route)
        stream.add(p, "drifted", "shadow", tag)
    if rerouted and len(routes) >= 1:
        target = next(iter(routes))
        notes.append(f"drifted routes {', '.join(sorted(rerouted))} re-routed onto {target}")
    if noise_as_shadow:
        notes.append(
            f"noise as shadow: {len(healthy_noise) - len(held_out)} noise pairs feed the floor, "
            f"{len(held_out)} are judged as shadow pairs"
        )
    calibration = tuple(p for p in calibrate if p.kind == "noise")
    if calibrate and not calibration:
        notes.append("--calibrate file holds no noise pairs")
    return EvalPlan(tuple(routes.values()), calibration, tuple(notes))
