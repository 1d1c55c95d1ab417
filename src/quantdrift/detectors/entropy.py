"""Token-distribution signals: entropy, KL, argmax flips, teacher-forced gap.

Text metrics only see what was sampled; these see how sure the model was.
A quantized model whose per-token entropy collapses (or balloons), or whose
top-k distribution moves away from the reference's, drifts before its text
visibly does. Every function takes what the gateway sent and returns None when
that was not enough to compute the metric: gateways send what they have.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import numpy.typing as npt

from quantdrift.schemas.pair import ModelOutput

FloatArray = npt.NDArray[np.float64]

# Probability given to a token one side did not list in its top-k, at least this
# much: it bounds log(p/q) at ~13.8 nats so one unlisted token cannot dominate KL.
PROB_FLOOR = 1e-6


def entropy_from_top_logprobs(top_logprobs: Sequence[Mapping[str, float]]) -> FloatArray:
    """Per-position entropy (nats) of the *renormalized* top-k distribution.

    Only the top-k alternatives are known, so this is the entropy of those k
    probabilities rescaled to sum to 1: a lower bound-ish proxy of the true
    entropy that is exact when the top-k hold nearly all the mass, and
    comparable between two sides that send the same k. Empty positions are skipped.

    Examples
    --------
    >>> import math
    >>> h = entropy_from_top_logprobs([{"a": math.log(0.5), "b": math.log(0.5)}, {"a": 0.0}])
    >>> [round(float(x), 6) for x in h]  # ln 2 for a fair coin, 0 for a certain token
    [0.693147, 0.0]
    """
    rows = [list(d.values()) for d in top_logprobs if d]
    if not rows:
        return np.empty(0, dtype=np.float64)
    width = max(map(len, rows))
    if all(len(r) == width for r in rows):
        lp = np.asarray(rows, dtype=np.float64)
    else:
        lp = np.full((len(rows), width), -np.inf)
        for i, r in enumerate(rows):
            lp[i, : len(r)] = r
    lse = np.logaddexp.reduce(lp, axis=1, keepdims=True)
    logq = lp - lse
    q = np.exp(logq)
    terms = q * np.where(q > 0, logq, 0.0)  # 0 * log 0 = 0 for padding
    return np.maximum(-terms.sum(axis=1), 0.0)


def token_entropies(output: ModelOutput) -> FloatArray | None:
    """The output's per-token entropy: its ``entropy`` field if sent, else from
    ``top_logprobs`` (renormalized top-k, see above); None when neither is there."""
    if output.entropy:
        return np.asarray(output.entropy, dtype=np.float64)
    if output.top_logprobs:
        h = entropy_from_top_logprobs(output.top_logprobs)
        return h if h.size else None
    return None


def entropy_stats(entropies: FloatArray | None) -> tuple[float | None, float | None]:
    """(mean, minimum) of per-token entropies; (None, None) when unknown.

    Examples
    --------
    >>> entropy_stats(np.array([0.5, 0.1, 0.3]))
    (0.3, 0.1)
    """
    if entropies is None or entropies.size == 0:
        return None, None
    return float(entropies.mean()), float(entropies.min())


def _floored_probs(logprobs: Mapping[str, float], support: Sequence[str]) -> list[float]:
    # Tokens this side did not list share its missing mass (1 - sum of listed
    # probabilities), but none gets more than its smallest listed token (it would
    # have been listed) nor less than PROB_FLOOR. Then renormalize over the support.
    # min(lp, 0): a log-prob above 0 is a gateway bug; it must not overflow exp.
    probs = {t: math.exp(min(lp, 0.0)) for t, lp in logprobs.items()}
    missing = len(support) - len(probs)
    floor = 0.0
    if missing:
        residual = max(0.0, 1.0 - sum(probs.values()))
        floor = max(PROB_FLOOR, min(residual / missing, min(probs.values())))
    # Every probability at least PROB_FLOOR, so log(p / q) is always finite.
    values = [max(probs.get(t, floor), PROB_FLOOR) for t in support]
    total = sum(values)
    return [v / total for v in values]


def _kl(p_lp: Mapping[str, float], q_lp: Mapping[str, float]) -> float:
    # Ordered (not a set) so the float sum is the same in every process.
    support = [*p_lp, *(t for t in q_lp if t not in p_lp)]
    p = _floored_probs(p_lp, support)
    q = _floored_probs(q_lp, support)
    kl = sum(a * (math.log(a) - math.log(b)) for a, b in zip(p, q, strict=True))
    return max(kl, 0.0)


def kl_and_flip_rate(
    reference_top: Sequence[Mapping[str, float]] | None,
    candidate_top: Sequence[Mapping[str, float]] | None,
) -> tuple[float | None, float | None]:
    """Mean KL(reference ‖ candidate) and argmax flip rate over aligned positions.

    Position ``i`` of one side is aligned with position ``i`` of the other when
    both sent a non-empty top-k there. KL is computed on the union of both
    top-k supports, each side's unlisted tokens getting a floor share of its
    missing mass (see ``_floored_probs``). A flip is a position whose most
    likely token differs. After the texts diverge the two sides condition on
    different prefixes, so both numbers are meaningful against a noise floor
    (reference vs reference), not as absolutes. (None, None) without aligned positions.

    Examples
    --------
    >>> import math
    >>> ref = [{"a": math.log(0.5), "b": math.log(0.5)}, {"x": 0.0}]
    >>> cand = [{"a": math.log(0.5), "b": math.log(0.5)}, {"y": 0.0}]
    >>> kl, flips = kl_and_flip_rate(ref, cand)
    >>> round(kl, 3), flips  # 0 at the first position; ~log(1/1e-6) / 2 at the second
    (6.908, 0.5)
    """
    if not reference_top or not candidate_top:
        return None, None
    total_kl, flips, aligned = 0.0, 0, 0
    for p, q in zip(reference_top, candidate_top, strict=False):
        if not p or not q:
            continue
        aligned += 1
        total_kl += _kl(p, q)
        if max(p, key=p.__getitem__) != max(q, key=q.__getitem__):
            flips += 1
    if not aligned:
        return None, None
    return total_kl / aligned, flips / aligned


def entropy_shift(candidate_mean: float | None, reference_mean: float | None) -> float | None:
    """Candidate mean entropy minus reference mean entropy (nats); None if either is unknown."""
    if candidate_mean is None or reference_mean is None:
        return None
    return candidate_mean - reference_mean


def teacher_forced_gap(
    reference_own: Sequence[float] | None, reference_on_candidate: Sequence[float] | None
) -> float | None:
    """mean(reference's log-probs of its own tokens) − mean(reference's log-probs of
    the candidate's tokens).

    How much less likely the reference model finds the candidate's text than its
    own: ~0 when the candidate writes what the reference would, growing as it
    wanders. None unless both lists are present and non-empty.

    Examples
    --------
    >>> teacher_forced_gap([-0.5, -0.5], [-1.0, -2.0])
    1.0
    """
    if not reference_own or not reference_on_candidate:
        return None
    own = float(np.mean(np.asarray(reference_own, dtype=np.float64)))
    cross = float(np.mean(np.asarray(reference_on_candidate, dtype=np.float64)))
    return own - cross
