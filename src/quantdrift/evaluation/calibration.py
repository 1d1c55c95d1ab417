"""The noise floor's seed values per decoding mode, from offline ``noise`` pairs.

Shared by ``quantdrift calibrate`` (which writes them to Redis) and
``quantdrift eval`` (which seeds the in-memory breaker), so both start from
the same floor.

Greedy decoding is deterministic: two greedy reference runs give the same
text, so a greedy reference-vs-reference pair is identical and says nothing
about how much disagreement is normal. Identical noise pairs are therefore
left out, and when a mode has fewer than ``min_pairs`` informative noise
pairs, its floor is seeded from the *sampled* noise pairs instead (the
lab's noise pairs are the reference against a second sampled reference). That
proxy is conservative for greedy shadow pairs: two sampled runs of one model
disagree more than the greedy runs of a healthy quantized model and its
reference, so a greedy pair beyond the sampled floor is well beyond normal.
"""

from __future__ import annotations

from collections.abc import Iterable

from quantdrift.detectors.noise_floor import metric_values
from quantdrift.schemas.score import ScoreEvent

MODES = ("greedy", "sampled")


def identical(score: ScoreEvent) -> bool:
    """Both sides tokenized the same (no divergence, same length): an echo, not noise."""
    m = score.metrics
    return (
        m.first_divergence is None
        and m.candidate_tokens is not None
        and m.candidate_tokens == m.reference_tokens
    )


def floor_seed(
    scores: Iterable[ScoreEvent], min_pairs: int = 30
) -> tuple[dict[str, list[dict[str, float]]], dict[str, str]]:
    """``({mode: [metric values per noise pair]}, {mode: where its values came from})``.

    Only ``kind == "noise"`` scores count. A mode with fewer than ``min_pairs``
    informative (non-identical) pairs for greedy borrows the sampled values
    when there are enough of those; otherwise each mode keeps what it has.

    Examples
    --------
    >>> from quantdrift.schemas import Metrics
    >>> s = lambda i, mode, c: ScoreEvent(pair_id=str(i), route="r", kind="noise", ts=0,
    ...     decoding=mode, metrics=Metrics(cosine=c, first_divergence=0, candidate_tokens=3))
    >>> seed, source = floor_seed([s(i, "sampled", 0.9) for i in range(3)], min_pairs=2)
    >>> len(seed["greedy"]), source
    (3, {'greedy': 'sampled noise pairs (greedy proxy)', 'sampled': 'sampled noise pairs'})
    """
    own: dict[str, list[dict[str, float]]] = {mode: [] for mode in MODES}
    for score in scores:
        if score.kind != "noise" or identical(score):
            continue
        values = metric_values(score.metrics)
        if values:
            own[score.decoding].append(values)
    seed: dict[str, list[dict[str, float]]] = {}
    source: dict[str, str] = {}
    for mode in MODES:
        # Only greedy borrows: the sampled floor is the wider one, so greedy on it
        # is conservative, while sampled pairs judged on a greedy floor would not be.
        if mode == "greedy" and len(own[mode]) < min_pairs <= len(own["sampled"]):
            seed[mode], source[mode] = own["sampled"], "sampled noise pairs (greedy proxy)"
        else:
            seed[mode], source[mode] = own[mode], f"{mode} noise pairs"
    return seed, source
