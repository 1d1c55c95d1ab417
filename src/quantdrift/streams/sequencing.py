"""Release each route's outcomes in the order its pairs arrived, each once it is known.

The score agent finishes a batch's pairs at two times: those the static tier
settles at once, those it escalates to the full model later, on their own lane.
This sequencer is what keeps that split from reordering a route: an outcome
leaves only when every earlier pair *of its route* has left, so a route's scores
reach the scores topic in the order its pairs reached this worker, exactly as
when the whole batch was sent at once. Pairs of other routes do not wait.

Why per route and why order at all: the judge folds a route's scores in the
order they arrive, and its e-detectors stay valid only if which score is folded
next is never chosen by looking at score values. Whether a pair escalates is
decided by its static cosine (a value); "escalated pairs arrive later" would
therefore move near-threshold pairs behind their neighbours, a value-chosen
order. Holding a route's later pairs behind its escalated one keeps the order
the arrival order, whatever the values. Routes are folded independently
(state, floors and dedupe are per route), so their relative order decides
nothing and is free to change. (With several scorers on one route, what time
still does to the interleaving of their outputs is in ``schemas/record_keys.py``.)

Pure and synchronous: tickets in, outcomes out; the agent does the sending.

Examples
--------
>>> seq = RouteSequencer()
>>> for ticket, route in [(1, "a"), (2, "a"), (3, "b")]:
...     seq.add(ticket, route)
>>> seq.settle(2, "a2"); seq.settle(3, "b3")
>>> seq.release()  # a2 waits for a1; b3 waits for nothing
['b3']
>>> seq.settle(1, "a1")
>>> seq.release(), len(seq)
(['a1', 'a2'], 0)
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable
from typing import Generic, TypeVar

T = TypeVar("T")
_UNSET: object = object()


class RouteSequencer(Generic[T]):
    """Per-route FIFO of tickets; :meth:`release` pops every settled head, in order."""

    def __init__(self) -> None:
        self._queues: dict[str, deque[Hashable]] = {}
        self._route: dict[Hashable, str] = {}
        self._value: dict[Hashable, object] = {}

    def __len__(self) -> int:
        """Tickets added and not yet released."""
        return len(self._route)

    def add(self, ticket: Hashable, route: str) -> None:
        """Queue ``ticket`` behind every ticket of ``route`` not yet released."""
        if ticket in self._route:
            raise ValueError(f"ticket {ticket!r} is already queued")
        self._route[ticket] = route
        self._value[ticket] = _UNSET
        self._queues.setdefault(route, deque()).append(ticket)

    def settle(self, ticket: Hashable, value: T) -> None:
        """The outcome of ``ticket``; it leaves once its route's earlier tickets have."""
        if ticket not in self._route:
            raise KeyError(f"ticket {ticket!r} is not queued")
        self._value[ticket] = value

    def release(self) -> list[T]:
        """Every outcome now free to leave: per route in order, routes by first queued."""
        out: list[T] = []
        for route in list(self._queues):
            queue = self._queues[route]
            while queue and self._value[queue[0]] is not _UNSET:
                ticket = queue.popleft()
                del self._route[ticket]
                out.append(self._value.pop(ticket))  # type: ignore[arg-type]
            if not queue:
                del self._queues[route]
        return out
