"""What a test checks of the reference's view on a teacher-forced pair, on any engine."""

from __future__ import annotations

from quantdrift.detectors.divergence import FLOOR, divergent_token, first_divergence
from quantdrift.schemas import PairEvent


def forced_view_holds(pair: PairEvent, k: int = 5) -> str:
    """The reference's view the gateway put on a pair (the lab's ``/v1/score`` with the
    gateway's ``top_logprobs`` as ``top_k``; vLLM's ``prompt_logprobs: K``) agrees with
    itself, position by position, and the worker reads the first divergent token from it
    by the stated definition; returns that token's line (or why there is none)."""
    forced = pair.reference_logprobs_on_candidate or []
    ranks, top = pair.reference_rank_on_candidate, pair.reference_top_on_candidate
    assert ranks is not None and top is not None
    assert len(ranks) == len(top) == len(forced)
    for lp, rank, best in zip(forced, ranks, top, strict=True):
        # At most k: two ids that decode alike share one key.
        assert 1 <= len(best) <= k  # the gateway's top_logprobs
        values = sorted(best.values(), reverse=True)
        assert lp <= values[0] + 1e-4  # nothing above the reference's top-1
        if rank == 1:
            assert abs(lp - values[0]) < 1e-4
        elif rank <= k:
            assert any(abs(lp - v) < 1e-4 for v in values)  # among the top-k
        else:
            assert lp <= values[-1] + 1e-4  # outside them
    found = divergent_token(pair)
    at = first_divergence(forced, ranks, top)
    if pair.candidate.tokens is None or len(pair.candidate.tokens) != len(forced):
        return f"not aligned ({len(forced)} forced tokens)"
    if at is None:
        assert found is None
        return "none (the reference's top-1, or likely, at every token)"
    assert found is not None and found.position == at and found.rank == ranks[at]
    assert all(
        r == 1 or (r <= k and lp >= FLOOR) for r, lp in zip(ranks[:at], forced[:at], strict=True)
    )
    return found.line()
