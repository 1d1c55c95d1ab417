"""A certificate's live evidence per route: what it binds beyond the slices, and its checks.

A certificate's ``live.text`` is embedded verbatim and covered by its signature and
its SHA-256. When it is ``quantdrift route status --json`` (a list of route rows),
each row also carries the evidence ``breaker/evidence.py`` writes: ``window`` (the
first and last pair times), ``calibration`` (each decoding mode's floor: its noise
and blessed pair counts and SHA-256) and ``worst_pairs`` (by the SHA-256 of their
pair ids). Both verifiers (this module through ``schemas.certificate.check``, and
``examples/verify_certificate.js``) check, with the same words:

* every route row carries all three (a route status from before they were kept
  binds less than the certificate claims, and is refused);
* a route with pairs has a window, whose start is not after its end, and which ends
  before the certificate was issued (``CLOCK_SKEW_S`` allowed between the gateways'
  clocks, which stamp pairs, and the issuer's): evidence from the future is forged
  or mis-clocked;
* every calibration and worst-pair hash is a SHA-256 (64 lowercase hex digits).

A ``replay --json`` document binds only what replay knows (pairs and trips); nothing
here is asked of it.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Mapping
from typing import Any

CLOCK_SKEW_S = 300.0
FIELDS = ("window", "calibration", "worst_pairs")
WINDOW = ("first_pair_at", "last_pair_at")
_SHA256 = re.compile(r"[0-9a-f]{64}")


def live_routes(live_text: str | None) -> list[dict[str, Any]]:
    """Per route of a ``route status --json`` document: its pairs and the three fields
    (absent ones as None); ``[]`` for any other document (pure).

    >>> (row,) = live_routes('[{"route": "r", "pairs_seen": 2, "window": null}]')
    >>> row["pairs"], row["window"], row["calibration"], row["carried"]
    (2, None, None, ['window'])
    """
    try:
        doc = json.loads(live_text) if live_text else None
    except ValueError:
        return []
    if not isinstance(doc, list):
        return []
    return [
        {
            "route": str(r["route"]),
            "pairs": int(r.get("pairs_seen") or 0),
            **{f: r.get(f) for f in FIELDS},
            "carried": [f for f in FIELDS if f in r],
        }
        for r in doc
        if isinstance(r, Mapping) and "route" in r
    ]


def _time(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _sha(value: Any) -> bool:
    return isinstance(value, str) and _SHA256.fullmatch(value) is not None


def route_problems(row: Mapping[str, Any], issued_at: float) -> list[str]:
    """What is wrong with one route's evidence (see the module), in the verifiers' words.

    >>> route_problems({"route": "r", "pairs": 3, "window": {"first_pair_at": 5.0,
    ...     "last_pair_at": 900.0}, "calibration": [], "worst_pairs": [],
    ...     "carried": ["window", "calibration", "worst_pairs"]}, 100.0)
    ['live evidence r: its time window ends after the certificate was issued']
    """
    where = f"live evidence {row['route']}"
    missing = [f for f in FIELDS if f not in row["carried"]]
    if missing:
        return [f"{where}: carries no {', '.join(missing)}"]
    problems = []
    w = row["window"]
    if w is None:
        if row["pairs"] > 0:
            problems.append(f"{where}: no time window for its {row['pairs']} pairs")
    elif not (
        isinstance(w, Mapping) and _time(w.get("first_pair_at")) and _time(w.get("last_pair_at"))
    ):
        problems.append(f"{where}: its time window is not two times")
    else:
        if w["first_pair_at"] > w["last_pair_at"]:
            problems.append(f"{where}: its time window ends before it starts")
        if w["last_pair_at"] > issued_at + CLOCK_SKEW_S:
            problems.append(f"{where}: its time window ends after the certificate was issued")
    for name, key in (("calibration", "sha256"), ("worst_pairs", "pair_sha256")):
        items = row[name]
        if not isinstance(items, list):
            problems.append(f"{where}: {name} is not a list")
            continue
        for i, item in enumerate(items):
            if not (isinstance(item, Mapping) and _sha(item.get(key))):
                problems.append(f"{where}: {name} {i + 1}: not a SHA-256")
    return problems


def live_problems(live_text: str | None, issued_at: float) -> list[str]:
    """Every route's problems, in document order (pure)."""
    try:
        return [p for row in live_routes(live_text) for p in route_problems(row, issued_at)]
    except (KeyError, TypeError, ValueError, AttributeError):
        return ["live evidence: unreadable route rows"]


def evidence_of(payload: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """What both verifiers print of a verified payload's live evidence: per route its
    pairs, window, calibration and worst pairs (``[]`` without a route status)."""
    if not payload:
        return []
    text = (payload.get("live") or {}).get("text")
    try:
        rows = live_routes(text if isinstance(text, str) else None)
    except (KeyError, TypeError, ValueError):
        return []
    return [{k: r[k] for k in ("route", "pairs", *FIELDS)} for r in rows]


def evidence_lines(evidence: list[dict[str, Any]]) -> list[str]:
    """``verify-certificate``'s lines for it, one per route, calibration and worst pair.

    >>> for line in evidence_lines([{"route": "r", "pairs": 9, "window": {"first_pair_at": 0.0,
    ...     "last_pair_at": 60.0}, "calibration": [{"mode": "greedy", "noise_pairs": 3,
    ...     "blessed_pairs": 0, "sha256": "ab" * 32}], "worst_pairs": []}]):
    ...     print(line[:72])
    evidence r: 9 pairs from 1970-01-01T00:00:00Z to 1970-01-01T00:01:00Z
      calibration greedy: 3 noise + 0 blessed pairs, sha256 abababababababab
    """
    lines = []
    for r in evidence:
        w = r.get("window")
        span = f" from {_utc(w['first_pair_at'])} to {_utc(w['last_pair_at'])}" if w else ""
        lines.append(f"evidence {r['route']}: {r['pairs']} pairs{span}")
        for c in r.get("calibration") or []:
            lines.append(
                f"  calibration {c.get('mode')}: {c.get('noise_pairs')} noise + "
                f"{c.get('blessed_pairs')} blessed pairs, sha256 {c.get('sha256')}"
            )
        for p in r.get("worst_pairs") or []:
            lines.append(
                f"  worst pair {p.get('pair_sha256')}: similarity {p.get('similarity')}; "
                f"{', '.join(p.get('reasons') or []) or 'no reason'}"
            )
    return lines


def _utc(ts: Any) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(float(ts)))
