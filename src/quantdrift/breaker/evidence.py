"""A route's live evidence as a certificate binds it: the time window, the calibration
it was judged against, and the worst pairs by hash (pure).

``quantdrift route status --json`` prints it for each route (``window``,
``calibration``, ``worst_pairs``), and ``preflight certificate --live`` embeds that
document verbatim: a certificate handed to another team then says over which pairs,
against which floor and blessing, and on which pairs its verdict rests.

* ``window``: the pair times (the gateway's ``ts``) of the first and the last shadow
  pair the route's ``pairs_seen`` counts; None before the first pair, or for a state
  written before windows were kept.
* ``calibration``: per decoding mode with a floor, how many noise pairs and blessed
  pairs it holds (the largest count over its metrics), the metrics it covers, and
  its SHA-256 (``NoiseFloorState.sha256``, the hash ``quantdrift calibrate`` prints).
* ``worst_pairs``: the worst pairs since the last transition, each by the SHA-256 of
  its pair id, with its similarity and reasons: whoever holds the pairs topic finds
  them (hash the ids), and the certificate discloses no request id to its readers.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

from quantdrift.breaker.rules.tolerance import summary
from quantdrift.breaker.state import RouteState
from quantdrift.detectors.noise_floor import NoiseFloorState
from quantdrift.detectors.tolerance import BLESSED


def pair_sha256(pair_id: str) -> str:
    """How a certificate names a pair: SHA-256 (hex) of its id's UTF-8 bytes.

    >>> pair_sha256("req-1:shadow")[:16]
    '94d4f4bdecb03204'
    """
    return hashlib.sha256(pair_id.encode()).hexdigest()


def window(state: RouteState) -> dict[str, float] | None:
    """The first and last pair times of the evidence, or None (see the module)."""
    if state.pairs_seen == 0 or state.first_pair_at is None or state.last_pair_at is None:
        return None
    return {"first_pair_at": state.first_pair_at, "last_pair_at": state.last_pair_at}


def calibration(floors: Mapping[str, NoiseFloorState]) -> list[dict[str, Any]]:
    """One row per decoding mode's floor: sizes, metrics and hash.

    >>> rows = calibration({"greedy": NoiseFloorState({"rougeL": (0.9, 1.0),
    ...     "blessed:rougeL": (0.8,), "blessed:hard": (0.0,)})})
    >>> [(r["mode"], r["noise_pairs"], r["blessed_pairs"], r["metrics"]) for r in rows]
    [('greedy', 2, 1, ['rougeL'])]
    """
    rows = []
    for mode, floor in sorted(floors.items()):
        noise = {k: len(v) for k, v in floor.values.items() if not k.startswith(BLESSED)}
        blessed = [len(v) for k, v in floor.values.items() if k.startswith(BLESSED)]
        rows.append(
            {
                "mode": mode,
                "noise_pairs": max(noise.values(), default=0),
                "blessed_pairs": max(blessed, default=0),
                "metrics": sorted(noise),
                "sha256": floor.sha256(),
            }
        )
    return rows


def worst_pairs(state: RouteState) -> list[dict[str, Any]]:
    """The route's worst pairs, worst first, by hash (see the module)."""
    return [
        {
            "pair_sha256": pair_sha256(w.pair_id),
            "similarity": w.similarity,
            "reasons": list(w.reasons),
        }
        for w in state.worst
    ]


def live_evidence(state: RouteState, floors: Mapping[str, NoiseFloorState]) -> dict[str, Any]:
    """What ``route status --json`` adds to a route's row: the three fields, and the
    route's own tolerance tests (``tests``: per signal its pairs, mean x and log
    e-value, as each slice's row has them)."""
    return {
        "tests": summary(state.rules.tolerance.tests),
        "window": window(state),
        "calibration": calibration(floors),
        "worst_pairs": worst_pairs(state),
    }
