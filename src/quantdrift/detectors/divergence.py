"""The first divergent token of a teacher-forced pair: where the candidate first left the
reference. Pure: the scoring worker calls it on each pair, the alert shows it.

A teacher-forced pass gives, at each of the candidate's tokens, the reference's
log-prob of that token, and where the server reports them (vLLM ``prompt_logprobs: K``,
the lab's ``/v1/score`` with ``top_k``) the token's rank among all of the reference's
and the reference's own top-k there (``PairEvent.reference_*_on_candidate``).

**Definition.** The first divergent token is the first position ``i`` (0-based, in the
candidate's answer tokens) where the candidate's token is **not the reference's top-1**
(rank > 1) **and** either falls **out of the reference's top-k** (rank > k, k the number
of alternatives the reference reported there) or has a reference log-prob **below the
floor** ``log(0.1)`` (the reference gave it less than a 10 % chance). Without ranks
(a server that reports none) only the floor applies. None: no position qualifies.

Why both conditions: a sampled candidate legitimately takes the reference's second or
third choice when it is likely (rank 2 at p = 0.3 is sampling, not drift); a token the
reference ranks first is never a divergence whatever its probability (a flat
distribution); and a token outside the top-k or under 10 % is one the reference would
rarely have written. Everything after that position is conditioned on a prefix the
reference would not have produced, so it is where an on-call engineer should look.

**Privacy** (docs/privacy.md). The tokens (the candidate's and the reference's
preferred ones) are left out on a private request; the answer before the token
(``context``, the last few tokens) only travels when the pair carries its prompt in
clear, i.e. where the route already shows the prompt.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from quantdrift.schemas.pair import PairEvent
from quantdrift.schemas.score import DivergentToken

FLOOR = math.log(0.1)
CONTEXT_TOKENS = 8
PREFERRED_SHOWN = 5


def first_divergence(
    forced: Sequence[float],
    ranks: Sequence[int] | None,
    top: Sequence[dict[str, float]] | None,
    floor: float = FLOOR,
) -> int | None:
    """The first divergent position (module docstring), or None.

    >>> first_divergence([-0.1, -3.0, -9.0], [1, 1, 7], [{"a": -0.1}] * 3)
    2
    >>> first_divergence([-0.1, -1.5, -0.2], [1, 2, 1], [{"a": -0.1, "b": -1.5}] * 3) is None
    True
    >>> first_divergence([-0.1, -2.5], None, None)
    1
    """
    for i, logprob in enumerate(forced):
        if ranks is None:
            if logprob < floor:
                return i
            continue
        k = len(top[i]) if top is not None and i < len(top) else 1
        if ranks[i] > 1 and (ranks[i] > k or logprob < floor):
            return i
    return None


def divergent_token(pair: PairEvent, floor: float = FLOOR) -> DivergentToken | None:
    """The pair's first divergent token with what the on-call engineer needs about it,
    within the privacy rule (module docstring); None without a usable forced pass."""
    forced = pair.reference_logprobs_on_candidate
    tokens = pair.candidate.tokens
    if not forced or not tokens or len(tokens) != len(forced):
        return None
    ranks = pair.reference_rank_on_candidate
    top = pair.reference_top_on_candidate
    if ranks is not None and len(ranks) != len(forced):
        ranks = None
    if top is not None and len(top) != len(forced):
        top = None
    i = first_divergence(forced, ranks, top if ranks is not None else None, floor)
    if i is None:
        return None
    own = pair.candidate.token_logprobs
    shown = not pair.request.private
    preferred = sorted((top[i] if top is not None else {}).items(), key=lambda kv: -kv[1])
    return DivergentToken(
        position=i,
        of=len(forced),
        token=tokens[i] if shown else None,
        rank=None if ranks is None else ranks[i],
        reference_logprob=forced[i],
        candidate_logprob=own[i] if own is not None and len(own) == len(forced) else None,
        preferred=dict(preferred[:PREFERRED_SHOWN]) if shown else {},
        context=_context(tokens, i) if shown and pair.request.prompt is not None else None,
    )


def _context(tokens: Sequence[str], i: int) -> str:
    """The candidate's answer just before position ``i`` (at most ``CONTEXT_TOKENS``).

    >>> _context(["a", "b", "c"], 2)
    'ab'
    """
    return "".join(tokens[max(0, i - CONTEXT_TOKENS) : i])[-200:]
