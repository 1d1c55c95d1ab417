"""The worker's own stall check: records wait on a partition it holds, and none is done.

A worker that stops reading while alive is the failure a crash restart never sees: the
process is up, the group is stable, the event loop idles, and every rollback waits. The
long soak found one (BENCHMARKS.md). Only "records wait and the committed offset does not
move" says stuck, so that is what this watches, per assigned partition:

* the partition's **end offset**, asked of the broker (a ListOffsets call: fresh; the
  consumer's own high watermark comes from its last fetch and freezes with it);
* the **next offset this worker has yet to finish**: the offset it last committed (Faust
  commits the next offset to read, once every record before it is scored or judged), or
  before its first commit the next offset it reads.

``behind`` (end minus that) is the consumer lag that ``/metrics`` and ``/status.json``
show. A partition is **stalled** when it has been behind for ``stall_after_s`` with that
offset unmoved. The clock starts at the first look that finds it behind, not at the
offset's last move: a worker idle for an hour whose offset then meets a new record has
been stuck for no time at all, and must not fail its liveness probe for it.
Committed, not read, offsets: Faust reads ahead into its buffers, so
an agent stuck on a batch would leave the read offset moving until thousands of records
were buffered; the committed one stops with the work. The worker then logs, once per
stall, what Faust and aiokafka hold for the partition (active, paused, buffered, the
stream queue, the flow), and ``/healthz`` answers 503: a liveness probe restarts it,
the restart reads again from the committed offsets, and the judge drops any pair it
had folded.

``StallWatch`` is the pure part (takes ``now``); ``look`` and ``consumer_state`` read
the live consumer, best effort, through Faust's private attributes: Faust has no public
view of them, and a view that raises must not break a health check (it is logged).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("quantdrift.worker")


@dataclass(slots=True)
class StallWatch:
    """Per partition: how far behind it is, and how long its committed offset has not moved.

    >>> w = StallWatch(stall_after_s=60)
    >>> w.observe(0, {"p/0": 10}, {"p/0": 50})  # 40 waiting, reading
    []
    >>> w.observe(30, {"p/0": 20}, {"p/0": 50}), w.behind
    ([], {'p/0': 30})
    >>> w.observe(80, {"p/0": 20}, {"p/0": 60})  # unmoved for 50 s: not yet
    []
    >>> w.observe(95.0, {"p/0": 20}, {"p/0": 60}), w.stalled  # 65 s, 40 waiting: stalled
    (['p/0'], {'p/0': 65.0})
    >>> w.observe(100, {"p/0": 20}, {"p/0": 60})  # still stalled: reported once
    []
    >>> w.observe(105, {"p/0": 60}, {"p/0": 60}), w.stalled  # caught up
    ([], {})
    >>> w.observe(500, {"p/0": 60}, {"p/0": 60}), w.stalled  # idle with nothing waiting
    ([], {})
    >>> w.observe(505, {"p/0": 60}, {"p/0": 64}), w.stalled  # a record after a long idle
    ([], {})
    >>> w.observe(570.0, {"p/0": 60}, {"p/0": 64}), w.stalled  # behind 65 s since: stalled
    (['p/0'], {'p/0': 65.0})
    """

    stall_after_s: float = 60.0
    behind: dict[str, int] = field(default_factory=dict)
    stalled: dict[str, float] = field(default_factory=dict)
    _next: dict[str, int] = field(default_factory=dict)
    _moved_at: dict[str, float] = field(default_factory=dict)

    def observe(
        self, now: float, unfinished: Mapping[str, int], ends: Mapping[str, int]
    ) -> list[str]:
        """Take one look (``unfinished``: each partition's next offset not yet finished);
        return the partitions that became stalled at it."""
        behind: dict[str, int] = {}
        stalled: dict[str, float] = {}
        newly: list[str] = []
        for tp, end in ends.items():
            nxt = unfinished.get(tp)
            if nxt is None:
                continue
            gap = max(0, end - nxt)
            # The clock restarts when the offset moves, and while nothing waits.
            if self._next.get(tp) != nxt or self.behind.get(tp, 0) == 0:
                self._next[tp], self._moved_at[tp] = nxt, now
            behind[tp] = gap
            idle = now - self._moved_at[tp]
            if gap > 0 and idle >= self.stall_after_s:
                stalled[tp] = idle
                if tp not in self.stalled:
                    newly.append(tp)
        for tp in [tp for tp in self._next if tp not in ends]:  # revoked
            del self._next[tp], self._moved_at[tp]
        self.behind, self.stalled = behind, stalled
        return newly

    def report(self) -> dict[str, float]:
        """The stalled partitions and for how long (s), as ``/healthz`` and ``/status.json``
        show them."""
        return {tp: round(s, 1) for tp, s in self.stalled.items()}


def _name(tp: Any) -> str:
    return f"{tp.topic}/{tp.partition}"


async def look(app: Any) -> tuple[dict[str, int], dict[str, int]]:
    """``(unfinished, ends)`` per assigned partition of the live consumer."""
    consumer = app.consumer
    tps = sorted(consumer.assignment())
    if not tps:
        return {}, {}
    thread = consumer._thread  # Faust's aiokafka consumer thread
    aio = thread._ensure_consumer()
    ends = await thread.call_thread(aio.end_offsets, tps)
    unfinished: dict[str, int] = {}
    for tp in tps:
        committed = consumer._committed_offset.get(tp)
        read = consumer._read_offset.get(tp)
        if committed is not None:
            unfinished[_name(tp)] = int(committed)
        elif read is not None:
            unfinished[_name(tp)] = int(read) + 1
        else:
            position = await consumer.position(tp)
            if position is not None:
                unfinished[_name(tp)] = int(position)
    return unfinished, {_name(tp): int(end) for tp, end in ends.items()}


def consumer_state(app: Any, names: set[str]) -> dict[str, Any]:
    """What Faust and aiokafka hold for the partitions ``names``: the stall's evidence."""
    consumer = app.consumer
    out: dict[str, Any] = {
        "flow_active": getattr(consumer, "flow_active", None),
        "can_resume_flow": consumer.can_resume_flow.is_set(),
    }
    try:
        aio_paused = {_name(tp) for tp in consumer._thread._ensure_consumer().paused()}
    except Exception as exc:  # evidence, best effort
        aio_paused, out["aiokafka_error"] = set(), repr(exc)
    index = getattr(app.topics, "_tp_index", {})
    for tp in consumer.assignment():
        name = _name(tp)
        if name not in names:
            continue
        queues = [
            {
                "qsize": chan.queue.qsize(),
                "maxsize": chan.queue.maxsize,
                "pending_drop_callbacks": len(
                    getattr(chan.queue, "_pending_pressure_drop_callbacks", ())
                ),
            }
            for chan in index.get(tp, ())
        ]
        out[name] = {
            "active": tp in (consumer._active_partitions or ()),
            "paused": tp in consumer._paused_partitions,
            "buffered": tp in consumer._buffered_partitions,
            "aiokafka_paused": name in aio_paused,
            "read_offset": consumer._read_offset.get(tp),
            "committed_offset": consumer._committed_offset.get(tp),
            "queues": queues,
        }
    return out
