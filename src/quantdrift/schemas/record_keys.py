"""Kafka record keys: score anywhere, judge per route. A wire contract for every producer.

* ``quantdrift.pairs.v1`` is keyed by ``pair_id``. Scoring is the expensive
  part; hashing the pair id spreads one busy route over every partition, so
  every worker scores a share of it. (A pair keyed by its route, as producers
  did before, is still accepted: it is scored, on one partition.)
* ``quantdrift.scores.v1``, ``control.v1`` and ``alerts.v1`` are keyed by
  ``route``. One partition, so one consumer, owns a route's judging: a route
  has a single writer, and the Redis step is compare-and-set besides.

Why the judge's decisions do not depend on this split:

* Which worker scores a pair does not change its score. Every worker builds
  its scorer from the same settings (one factory) and a pair is scored from
  its own fields alone, so any worker, or a second worker after a crash,
  emits the same ScoreEvent for the same pair.
* A redelivered pair (a worker killed before its offsets were committed) is
  scored again and its score sent again; the judge folds it once, because
  dedupe is on ``(route, kind, pair_id)`` in Redis, not on who scored it.
* Folding order does not depend on score values, which the e-detectors'
  validity needs (an e-process stays a supermartingale under the null only if
  which observation is folded next is not chosen by looking at the values).
  The order the judge folds is the order a route's scores land on its score
  partition, an interleaving of each scorer's output. What a scorer gets is
  fixed by ``hash(pair_id)``, blind to content; a scorer sends each route's
  scores in its input (arrival) order (``streams/sequencing.py``): a pair the
  static tier settles is sent at once, but never ahead of an earlier pair of
  its own route still waiting on the embedding model, so no pair is held back
  or sent early *relative to its route* for what it scored. The interleaving
  between scorers is set by when they send. With one scorer a route's
  folding order is its arrival order exactly, whatever the values. With
  several, time is the one content-dependent part: a pair that escalates
  finishes later on its scorer, and it moves together with its route's later
  pairs there (before the lanes, with its whole batch) relative to the other
X
  (~0.1-0.3 s) and was there before; removing it entirely would take a
  content-blind fold order at the judge (e.g. by pair time, with a reorder
  window), which this layout does not do. Routes are folded apart, so other
  routes' pairs need not wait for an escalation at all.
"""

from __future__ import annotations

from quantdrift.schemas.pair import PairEvent


def pair_record_key(pair: PairEvent) -> bytes:
    """The key of a pair on the pairs topic: its id, so pairs spread over partitions.

    >>> from quantdrift.schemas import ModelOutput
    >>> pair_record_key(PairEvent(pair_id="p1", ts=1.0, route="r/int4",
    ...     candidate=ModelOutput(text="a"), reference=ModelOutput(text="b")))
    b'p1'
    """
    return pair.pair_id.encode()


def route_record_key(route: str) -> bytes:
    """The key of a score, command or alert: its route, so one consumer judges a route."""
    return route.encode()


def pair_key_error(key: bytes | None, pair: PairEvent) -> str | None:
    """Why a pair's record key is wrong, or None when it is one a producer may use.

    The pair's id (the layout above), its route (producers written before
    the pairs were spread) or no key. Anything else names another pair or
    route: a producer bug that the DLQ should show rather than hide.

    >>> from quantdrift.schemas import ModelOutput
    >>> p = PairEvent(pair_id="p1", ts=1.0, route="r/int4",
    ...     candidate=ModelOutput(text="a"), reference=ModelOutput(text="b"))
    >>> [pair_key_error(k, p) is None for k in (b"p1", b"r/int4", None, b"x")]
    [True, True, True, False]
    """
    if key is None or key in (pair_record_key(pair), route_record_key(pair.route)):
        return None
    return (
        f"record key {key[:200]!r} names neither pair {pair.pair_id!r} nor route "
        f"{pair.route!r}: key pairs by pair_id (or by route)"
    )
