"""The worst pairs a route keeps for its alerts: which ones, and how they are shown. Pure.

A route keeps, since its last transition, the ``worst_pairs_kept`` worst shadow pairs
(failing ones first, then by similarity), and besides them the ``worst_pairs_kept``
worst *failing* pairs of each slice the policy judges: a slice that trips is then
shown its own pairs (:func:`evidence` with its ``where``), not the route's worst, which
a healthy but dissimilar majority could fill. Only failing pairs are kept per slice, so
a healthy route keeps a handful and a drifting slice its own few; the bound is
``worst_pairs_kept`` times one plus the slices judged.

Each kept pair carries what on-call needs to look at it: its slice tags, its prompt as
the pair carried it (salted hash, or an excerpt where the route sends prompts in
clear), and its first divergent token when it was teacher-forced
(``detectors/divergence.py``).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from quantdrift.breaker.policy import RoutePolicy
from quantdrift.breaker.rules.reading import Pair
from quantdrift.breaker.state import WorstPair


def entry(pair: Pair) -> WorstPair:
    """What the route keeps of one pair."""
    score = pair.score
    return WorstPair(
        score.pair_id,
        pair.similarity,
        pair.reasons,
        tags=dict(score.tags),
        prompt_hash=score.prompt_hash,
        prompt_excerpt=score.prompt_excerpt,
        divergence=None if score.divergence is None else score.divergence.model_dump(),
    )


def _badness(w: WorstPair) -> tuple[int, float]:
    return (0 if w.reasons else 1, w.similarity if w.similarity is not None else 1.0)


def _slices(policy: RoutePolicy, w: WorstPair) -> list[str]:
    return [f"{d}={w.tags[d]}" for d in policy.slice_dimensions if d in w.tags]


def keep(worst: tuple[WorstPair, ...], pair: Pair, policy: RoutePolicy) -> tuple[WorstPair, ...]:
    """``worst`` with ``pair`` folded in (module docstring)."""
    n = policy.worst_pairs_kept
    if n == 0 or (pair.verdict == "ok" and pair.similarity is None):
        return worst
    ranked = sorted((*worst, entry(pair)), key=_badness)
    kept: list[WorstPair] = []
    seen: Counter[str] = Counter()
    for i, w in enumerate(ranked):
        keys = _slices(policy, w) if w.reasons else []
        if i < n or any(seen[k] < n for k in keys):
            kept.append(w)
        seen.update(keys)
    return tuple(kept)


def evidence(
    worst: tuple[WorstPair, ...], n: int, where: tuple[str, str] | None = None
) -> list[dict[str, Any]]:
    """The ``n`` worst pairs as an alert's ``worst_pairs``: the route's, or with
    ``where`` (dimension, value) the slice's own."""
    if where is not None:
        worst = tuple(w for w in worst if w.tags.get(where[0]) == where[1])
    return [as_json(w) for w in sorted(worst, key=_badness)[:n]]


def as_json(w: WorstPair) -> dict[str, Any]:
    """One worst pair as alerts and the verdict API show it (no empty fields)."""
    out: dict[str, Any] = {
        "pair_id": w.pair_id,
        "similarity": w.similarity,
        "reasons": list(w.reasons),
    }
    if w.tags:
        out["tags"] = dict(w.tags)
    if w.prompt_excerpt is not None:
        out["prompt"] = w.prompt_excerpt
    elif w.prompt_hash is not None:
        out["prompt_hash"] = w.prompt_hash
    if w.divergence is not None:
        out["first_divergent_token"] = dict(w.divergence)
    return out
