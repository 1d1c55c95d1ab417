"""The adaptive shadow share's rule (``gateway/control/share.py``), as a table, and its cap.

The cap is checked as the module docstring states it: over any run of requests, the
reference tokens of jobs granted above the floor stay within ``cap * (T + burst_s)``
plus the jobs in flight when the bucket emptied.
"""

from __future__ import annotations

import numpy as np
import pytest

from quantdrift.gateway.control.share import (
    Evidence,
    Meter,
    ShareRule,
    decide,
    evidence_of,
    meter,
    want_of,
)

RULE = ShareRule(floor=0.01, max=0.2)
ARMED = {"state": "closed", "armed": True, "pairs": 100}


@pytest.mark.parametrize(
    ("evidence", "share", "reason"),
    [
        (Evidence(), 0.2, "warming"),  # nothing read yet: the thin side
        (Evidence(state="closed", pairs=5), 0.2, "warming"),  # below min_pairs / partly armed
        (Evidence(state="half_open", pairs=3, armed=True), 0.2, "warming"),  # the probe
        (Evidence(**ARMED, progress=0.0), 0.01, "quiet"),  # armed and quiet: the floor
        (Evidence(**ARMED, progress=0.5), 0.01, "quiet"),  # e-value at sqrt(threshold)
        (Evidence(**ARMED, progress=0.75), 0.105, "evidence"),  # halfway past calm
        (Evidence(**ARMED, progress=1.0), 0.2, "evidence"),  # at its threshold
        (Evidence(**ARMED, short_slices=6, slices=6), 0.029, "quiet"),  # slices short
        (Evidence(**ARMED, short_slices=3, slices=6), 0.0195, "quiet"),
    ],
)
def test_the_share_follows_the_evidence(evidence: Evidence, share: float, reason: str) -> None:
    got = decide(RULE, evidence, Meter())
    assert (got.share, got.reason) == (pytest.approx(share), reason)


def test_an_engine_change_restarts_the_evidence_and_the_share_rises_again() -> None:
    # The breaker restarts a route's evidence on a new candidate (pairs_seen 0, not armed).
    before = evidence_of({"state": "closed", "pairs_seen": 500, "candidate_engine": "a",
                          "readiness": {"armed": True, "progress": 0.1}})  # fmt: skip
    after = evidence_of({"state": "closed", "pairs_seen": 0, "candidate_engine": "b",
                         "readiness": {"armed": False}})  # fmt: skip
    assert want_of(RULE, before) == (0.0, "quiet")
    assert want_of(RULE, after) == (1.0, "warming")


@pytest.mark.parametrize("raw", [None, {}, {"state": "weird", "readiness": "x"}])
def test_unreadable_state_counts_as_unknown(raw: dict[str, object] | None) -> None:
    assert evidence_of(raw).state == "unknown"


def test_floor_above_max_is_refused() -> None:
    with pytest.raises(ValueError, match="floor <= max"):
        ShareRule(floor=0.3, max=0.2)


@pytest.mark.parametrize("seed", range(5))
def test_the_bucket_holds_the_cap_over_any_run(seed: int) -> None:
    """Requests at random times, each sampled at the share decided for it; a sampled job
    spends a random number of reference tokens, charged when it finishes (``lag`` requests
    later, as the meter learns of it after the calls)."""
    rng = np.random.default_rng(seed)
    cap, burst, lag = 50.0, 4.0, 3
    rule = ShareRule(floor=0.0, max=1.0, cap_reference_tps=cap, burst_s=burst, window_s=5.0)
    ev = Evidence()  # warming: wants every request
    m, now, spent, jobs = Meter(), 0.0, 0, 0
    pending: list[int] = []
    granted, max_job = 0, 0
    for _ in range(5000):
        now += float(rng.exponential(0.05))
        if len(pending) > lag:  # a job finishes: the meter sees its tokens
            spent += pending.pop(0)
            jobs += 1
        m = meter(rule, m, now, spent, jobs, 1)
        share = decide(rule, ev, m).share
        if rng.random() < share:
            job = int(rng.integers(10, 120))
            max_job = max(max_job, job)
            pending.append(job)
            granted += job
    assert granted <= cap * (now + burst) + (lag + 1) * max_job
    assert granted >= 0.5 * cap * now  # and the cap is used, not starved
