"""``quantdrift shadow cost``'s service: read the route's policy and gateway config,
estimate (``evaluation/shadow_cost.py``, pure), and lay the estimate out.

The share, the noise share and whether the route is teacher-forced come from the
gateway config when one is given (``--config`` with ``--route``: the route's own
``shadow_sample_rate`` / ``noise_sample_rate`` / ``teacher_forced``); flags override
them. Bad input is an :class:`~quantdrift.errors.InputError` with one line that says
which value is wrong.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quantdrift.breaker.policy import load_policy
from quantdrift.errors import InputError
from quantdrift.evaluation.shadow_cost import (
    Drift,
    Estimate,
    ReferenceSpeed,
    Traffic,
    estimate,
    parse_drift,
    share_within,
)
from quantdrift.gateway.gateway_config import load_config

DEFAULT_DRIFTS = ("hard=0.1", "outcomes=0.1")
_DURATION = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(s|m|h|d)?\s*$")
_UNIT_S = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


@dataclass(frozen=True, slots=True)
class CostRequest:
    """What the command line asked, as given (None: from the config, else the default)."""

    requests_per_s: float
    prompt_tokens: float
    completion_tokens: float
    reference_prompt_tps: float
    reference_completion_tps: float
    shares: Sequence[float] = ()
    noise_share: float | None = None
    teacher_forced: bool | None = None
    drifts: Sequence[str] = DEFAULT_DRIFTS
    within: str | None = None
    route: str | None = None
    policy_file: Path | None = None
    config_file: Path | None = None


def seconds(text: str) -> float:
    """``90``, ``90s``, ``30m``, ``2h`` or ``1d`` in seconds.

    >>> seconds("30m"), seconds("2h"), seconds("45")
    (1800.0, 7200.0, 45.0)
    """
    found = _DURATION.match(text)
    if not found or float(found.group(1)) <= 0:
        raise InputError(f"--within {text!r}: expected a positive duration such as 90s, 30m, 2h")
    return float(found.group(1)) * _UNIT_S[found.group(2) or "s"]


def _route_defaults(request: CostRequest) -> tuple[list[float], float, bool, int]:
    """(shares, noise share, teacher forced, builds judged) from the gateway config, else
    5 %, 0, off, 1."""
    shares, noise, forced, builds = [0.05], 0.0, False, 1
    if request.config_file is not None:
        config = load_config(request.config_file)
        route = request.route or config.route_default
        if route not in config.routes:
            known = ", ".join(sorted(config.routes))
            raise InputError(f"unknown route {route!r} in {request.config_file}; known: {known}")
        shares = [config.shadow_rate(route)]
        noise = config.noise_rate(route)
        forced = config.routes[route].teacher_forced
        builds = 1 + len(config.routes[route].extra_candidates)
    return (
        list(request.shares) or shares,
        noise if request.noise_share is None else request.noise_share,
        forced if request.teacher_forced is None else request.teacher_forced,
        builds,
    )


def shadow_cost(request: CostRequest) -> tuple[Estimate, dict[str, float | None]]:
    """The estimate, and per drift the smallest share that catches it ``within``."""
    shares, noise, forced, builds = _route_defaults(request)
    policy = load_policy(request.policy_file).for_route(request.route or "")
    try:
        traffic = Traffic(request.requests_per_s, request.prompt_tokens, request.completion_tokens)
        speed = ReferenceSpeed(request.reference_prompt_tps, request.reference_completion_tps)
        drifts: list[Drift] = [parse_drift(d) for d in request.drifts]
        found = estimate(policy, traffic, speed, shares, drifts, noise, forced, builds)
    except ValueError as exc:
        raise InputError(str(exc)) from None
    needed: dict[str, float | None] = {}
    if request.within is not None:
        limit = seconds(request.within)
        needed = {d.drift.label: share_within(d, traffic, limit) for d in found.detections}
    return found, needed


def as_json(found: Estimate, needed: dict[str, float | None], within: str | None) -> dict[str, Any]:
    """The estimate as one JSON document (``--json``)."""
    return {
        "traffic": {
            "requests_per_s": found.traffic.requests_per_s,
            "prompt_tokens": found.traffic.prompt_tokens,
            "completion_tokens": found.traffic.completion_tokens,
        },
        "reference": {
            "prompt_tokens_per_s": found.reference.prompt_tokens_per_s,
            "completion_tokens_per_s": found.reference.completion_tokens_per_s,
        },
        "detections": [
            {
                "drift": d.drift.label,
                "null_mean": d.null_mean,
                "arl": d.arl,
                "growth_per_pair": round(d.growth, 6),
                "pairs": None if d.pairs is None else round(d.pairs, 1),
                "never": d.why_never or None,
            }
            for d in found.detections
        ],
        "shares": [
            {
                "share": s.share,
                "noise_share": s.noise_share,
                "teacher_forced": s.teacher_forced,
                "candidates": s.candidates,
                "reference_prompt_tokens_per_s": round(s.reference_prompt_tokens_per_s, 3),
                "reference_completion_tokens_per_s": round(s.reference_completion_tokens_per_s, 3),
                "replica_share": round(s.replica_share, 5),
                "shadow_pairs_per_hour": round(s.shadow_pairs_per_hour, 1),
                "noise_pairs_per_hour": round(s.noise_pairs_per_hour, 1),
                "catch": [
                    {
                        "drift": c.drift,
                        "pairs": None if c.pairs is None else round(c.pairs, 1),
                        "seconds": None if c.seconds is None else round(c.seconds, 1),
                    }
                    for c in catches
                ],
            }
            for s, catches in found.rows
        ],
        "within": None if within is None else {"duration": within, "share_needed": needed},
    }


def _duration(s: float | None) -> str:
    if s is None:
        return "never"
    if s < 120:
        return f"{s:.0f} s"
    if s < 7200:
        return f"{s / 60:.1f} min"
    return f"{s / 3600:.1f} h"


def as_text(found: Estimate, needed: dict[str, float | None], within: str | None) -> str:
    """The estimate as lines for a person."""
    t, r = found.traffic, found.reference
    lines = [
        f"traffic: {t.requests_per_s:g} req/s, {t.prompt_tokens:g} prompt + "
        f"{t.completion_tokens:g} completion tokens per request; reference replica: "
        f"{r.prompt_tokens_per_s:g} prompt / {r.completion_tokens_per_s:g} completion tokens/s",
    ]
    for d in found.detections:
        pairs = f"never ({d.why_never})" if d.pairs is None else f"{d.pairs:.0f} shadow pairs"
        lines.append(f"drift {d.drift.label}: {pairs} expected (null {d.null_mean:g})")
    for s, catches in found.rows:
        forced = ", teacher-forced" if s.teacher_forced else ""
        if s.candidates > 1:
            forced += f", {s.candidates} builds on one reference answer"
        lines.append(
            f"share {s.share:.2%} (noise {s.noise_share:.2%}{forced}): reference "
            f"{s.reference_prompt_tokens_per_s:.1f} prompt + "
            f"{s.reference_completion_tokens_per_s:.1f} completion tokens/s = "
            f"{s.replica_share:.3g} reference replicas; {s.shadow_pairs_per_hour:.0f} shadow + "
            f"{s.noise_pairs_per_hour:.0f} noise pairs/h"
        )
        for c in catches:
            pairs = "never" if c.pairs is None else f"{c.pairs:.0f} pairs"
            lines.append(f"  catches {c.drift} in {pairs}, {_duration(c.seconds)}")
    for label, share in needed.items():
        what = "more than all traffic" if share is None else f"share {share:.2%}"
        lines.append(f"to catch {label} within {within}: {what}")
    return "\n".join(lines)
