"""Deterministic sampling: the same key always gets the same answer, in any language.

``bucket(key, salt)`` is the first 8 bytes of ``sha1(salt + key)`` (UTF-8),
read as a big-endian unsigned integer, shifted right by 11 and divided by
2**53 (exact in a double, so always below 1), so a gateway written in Go or Java can
reproduce the decision bit for bit. A request is sampled when its bucket is
below the rate: raising the rate only adds keys, it never drops a sampled one,
and a retried request (same id) is mirrored again or not at all.

Examples
--------
>>> sampled("req-1", 0.0), sampled("req-1", 1.0)
(False, True)
>>> sampled("req-1", 0.3) == sampled("req-1", 0.3)
True
"""

from __future__ import annotations

import hashlib
import math

_SCALE = float(2**53)


def bucket(key: str, salt: str = "") -> float:
    """The key's stable position in [0, 1)."""
    digest = hashlib.sha1((salt + key).encode("utf-8", "surrogatepass")).digest()
    return (int.from_bytes(digest[:8], "big") >> 11) / _SCALE


def sampled(key: str, rate: float, salt: str = "") -> bool:
    """True for a fraction ``rate`` of keys: 0 never, 1 always, stable per key."""
    if not (math.isfinite(rate) and 0.0 <= rate <= 1.0):
        raise ValueError(f"rate must be in [0, 1], got {rate!r}")
    if rate >= 1.0:
        return True
    return rate > 0.0 and bucket(key, salt) < rate
