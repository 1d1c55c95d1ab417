"""The shadow share that follows the evidence, under a cap: one pure decision.

A flat share pays as much on a quiet, armed route as on a route whose evidence is
thin. With ``adaptive_share`` a route's shadow share is recomputed from what the
breaker's state says about it (:class:`Evidence`, read from Redis by
``control/evidence.py``) and what shadowing has spent on its reference (the
``SpendMeter``'s reference tokens), so the gateway shadows more where it is unsure and
less where it is sure.

The rule, in order (``decide``):

1. **Thin evidence wants the most.** ``want = 1`` (the rule's ``max``) while the route
   is not closed and armed: no state read yet, warming (fewer than the policy's
   ``min_pairs``), partly armed (a relied-on test abstains), half-open (its probe wants
   pairs), or just after an engine change (the breaker restarts a route's evidence on a
   new candidate, so it is warming again).
2. **An armed route wants what its evidence is unsure of:** ``want`` is the larger of
   how near the nearest test is to its threshold and what its short slices ask. Near:
   its progress ``p = log e / log threshold`` (0 to 1) past ``calm``, rescaled,
   ``(p - calm) / (1 - calm)``; at the default ``calm`` of 0.5, a test wants more pairs
   once its e-value passes the square root of its threshold (a healthy route's tests
   wander below it: int8 on the traffic corpus sits near 0.2). And
   ``slice_want`` times the fraction of judged slice values that still have fewer than
   ``slice_min_pairs`` pairs (insufficient data). A fraction, not any one short value:
   a rare value fills at its own traffic share whatever the route's share, so one rare
   value must not hold the whole route at a high share.
3. **The share:** ``floor + (max - floor) * want``.
4. **The cap, in reference tokens per second.** A leaky bucket holds
   ``cap_reference_tps * burst_s`` tokens and refills at ``cap_reference_tps``; every
   reference token shadowing spends on the route (``shadow``, ``noise`` and
   ``teacher_forcing`` alike) is taken from it. While the bucket is empty, the share is
   the floor. While it holds tokens, the share is also held to the rate that would spend
   ``cap_reference_tps`` at the route's measured request rate and tokens per sampled
   request (the projection), so a steady route sits under the cap rather than
   oscillating against an empty bucket.
5. **Never below the floor, never above ``max``.** The floor wins over the cap: a route
   is never left unguarded. So the cap bounds everything above the floor.

Why it cannot spend more than the cap: a share above the floor is granted only while
the bucket holds tokens, and the bucket only refills at ``cap_reference_tps``. Over any
interval of ``T`` seconds, the reference tokens of requests sampled above the floor are at
most ``cap_reference_tps * T + cap_reference_tps * burst_s`` plus what the jobs already
in flight when the bucket emptied spend (at most ``shadow_concurrency + shadow_queue``
jobs). The floor's own spend is not capped, and ``/health`` says so (``reason: floor``).

Everything here is pure: the clock, the evidence and the tokens spent come in.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

# What an Evidence's state may be; "unknown": nothing read yet (the gateway's first
# seconds, a Redis that never answered).
STATES = ("unknown", "closed", "open", "half_open")


@dataclass(frozen=True, slots=True)
class Evidence:
    """What the breaker's state says about how sure a route's evidence is.

    ``progress``: the nearest test's log e-statistic over its threshold (0 to 1);
    ``short_slices``: judged slice values with fewer than ``slice_min_pairs`` pairs, of
    ``slices`` judged.
    """

    state: str = "unknown"
    pairs: int = 0
    armed: bool = False
    progress: float = 0.0
    short_slices: int = 0
    slices: int = 0
    engine: str = ""


def evidence_of(data: Mapping[str, Any] | None) -> Evidence:
    """Read a route's state JSON (``{prefix}route:{R}:state``, field ``s``) for the share.

    Only the fields named in ``schemas/keys.py`` are read, so the gateway does not
    depend on the breaker's other state.

    >>> evidence_of({"state": "closed", "pairs_seen": 40, "candidate_engine": "vllm",
    ...              "readiness": {"armed": True, "progress": 0.5, "short_slices": 1,
    ...                            "slices": 4}})  # doctest: +NORMALIZE_WHITESPACE
    Evidence(state='closed', pairs=40, armed=True, progress=0.5, short_slices=1, slices=4,
             engine='vllm')
    >>> evidence_of(None).state
    'unknown'
    """
    if not data:
        return Evidence()
    ready = data.get("readiness")
    ready = ready if isinstance(ready, Mapping) else {}
    state = data.get("state")
    progress = ready.get("progress", 0.0)
    return Evidence(
        state=state if state in STATES else "unknown",
        pairs=int(data.get("pairs_seen") or 0),
        armed=bool(ready.get("armed", False)),
        progress=_unit(progress if isinstance(progress, int | float) else 0.0),
        short_slices=int(ready.get("short_slices") or 0),
        slices=int(ready.get("slices") or 0),
        engine=str(data.get("candidate_engine") or ""),
    )


def _unit(x: float) -> float:
    return 0.0 if not math.isfinite(x) else min(1.0, max(0.0, x))


@dataclass(frozen=True, slots=True)
class ShareRule:
    """One route's adaptive share (``AdaptiveShareConfig``), frozen."""

    floor: float
    max: float
    cap_reference_tps: float | None = None
    burst_s: float = 30.0
    slice_want: float = 0.1
    calm: float = 0.5
    window_s: float = 60.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.calm <= 1.0:
            raise ValueError(f"calm must be in [0, 1], got {self.calm}")
        if not 0.0 <= self.floor <= self.max <= 1.0:
            raise ValueError(f"need 0 <= floor <= max <= 1, got {self.floor}, {self.max}")
        if self.cap_reference_tps is not None and self.cap_reference_tps <= 0:
            raise ValueError(f"cap_reference_tps must be > 0, got {self.cap_reference_tps}")


@dataclass(frozen=True, slots=True)
class Meter:
    """A route's spend as the governor last saw it, and its leaky bucket.

    ``tokens``: the bucket's level; ``spent``/``jobs``: the meter's cumulative reference
    tokens and sampled jobs at ``at``; ``requests``: requests counted in the window that
    started at ``since`` (with ``window_tokens``/``window_jobs`` spent in it).
    """

    at: float | None = None
    tokens: float = 0.0
    spent: float = 0.0
    jobs: int = 0
    since: float = 0.0
    requests: int = 0
    window_tokens: float = 0.0
    window_jobs: int = 0
    last_rate: float | None = None  # requests/s of the last full window
    last_per_job: float | None = None  # reference tokens per sampled job, last window


@dataclass(frozen=True, slots=True)
class Share:
    """The share now and why: ``warming``, ``evidence``, ``quiet``, ``capped``, ``floor``."""

    share: float
    want: float
    reason: str
    bucket: float | None


def want_of(rule: ShareRule, ev: Evidence) -> tuple[float, str]:
    """How much of the range the evidence wants (0 to 1), and the word for it.

    >>> rule = ShareRule(floor=0.01, max=0.2)
    >>> want_of(rule, Evidence(state="closed", pairs=5))
    (1.0, 'warming')
    >>> want_of(rule, Evidence(state="closed", pairs=50, armed=True, progress=0.3))
    (0.0, 'quiet')
    >>> want_of(rule, Evidence(state="closed", pairs=50, armed=True, progress=0.8))
    (0.6, 'evidence')
    >>> want_of(rule, Evidence(state="closed", pairs=50, armed=True, short_slices=2, slices=4))
    (0.05, 'quiet')
    """
    if ev.state != "closed" or not ev.armed:
        return 1.0, "warming"
    short = ev.short_slices / ev.slices if ev.slices else 0.0
    near = max(0.0, ev.progress - rule.calm) / (1.0 - rule.calm) if rule.calm < 1 else 0.0
    want = round(max(near, rule.slice_want * min(1.0, short)), 6)
    return want, "evidence" if want >= 0.25 else "quiet"


def meter(rule: ShareRule, m: Meter, now: float, spent: float, jobs: int, requests: int) -> Meter:
    """The bucket and window after the meter read ``spent`` tokens over ``jobs`` jobs and
    ``requests`` more requests arrived (state in, state out)."""
    cap = rule.cap_reference_tps
    if m.at is None:  # the first reading: a full bucket, a fresh window
        full = cap * rule.burst_s if cap is not None else 0.0
        return Meter(now, full, spent, jobs, now, requests)
    used, done = max(0.0, spent - m.spent), max(0, jobs - m.jobs)
    tokens = m.tokens
    if cap is not None:
        tokens = min(cap * rule.burst_s, tokens + cap * max(0.0, now - m.at)) - used
    out = replace(
        m,
        at=now,
        tokens=tokens,
        spent=spent,
        jobs=jobs,
        requests=m.requests + requests,
        window_tokens=m.window_tokens + used,
        window_jobs=m.window_jobs + done,
    )
    if now - m.since >= rule.window_s:
        span = now - m.since
        rate = out.requests / span if span > 0 else None
        per_job = out.window_tokens / out.window_jobs if out.window_jobs else m.last_per_job
        out = replace(out, since=now, requests=0, window_tokens=0.0, window_jobs=0,
                      last_rate=rate, last_per_job=per_job)  # fmt: skip
    return out


def projected(rule: ShareRule, m: Meter) -> float | None:
    """The share that would spend ``cap_reference_tps`` at the last window's request rate
    and tokens per job; None until a window has measured both."""
    cap = rule.cap_reference_tps
    if cap is None or not m.last_rate or not m.last_per_job:
        return None
    return cap / (m.last_rate * m.last_per_job)


def decide(rule: ShareRule, ev: Evidence, m: Meter) -> Share:
    """The route's share now (the module docstring's rule).

    >>> rule = ShareRule(floor=0.01, max=0.2, cap_reference_tps=100.0, burst_s=10)
    >>> decide(rule, Evidence(), Meter(at=0.0, tokens=1000.0))
    Share(share=0.2, want=1.0, reason='warming', bucket=1000.0)
    >>> decide(rule, Evidence(), Meter(at=0.0, tokens=-5.0)).reason
    'floor'
    >>> armed = Evidence(state="closed", pairs=99, armed=True, progress=0.0)
    >>> decide(rule, armed, Meter(at=0.0, tokens=1000.0)).share
    0.01
    >>> decide(rule, Evidence(), Meter(at=0, tokens=9, last_rate=10, last_per_job=500)).share
    0.02
    """
    want, reason = want_of(rule, ev)
    share = rule.floor + (rule.max - rule.floor) * want
    bucket = None
    if rule.cap_reference_tps is not None:
        bucket = m.tokens
        if m.tokens <= 0:
            share, reason = rule.floor, "floor"
        else:
            ceiling = projected(rule, m)
            if ceiling is not None and ceiling < share:
                share, reason = max(rule.floor, ceiling), "capped"
    return Share(round(min(rule.max, max(rule.floor, share)), 6), want, reason, bucket)
