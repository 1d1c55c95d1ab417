"""Joining a LiteLLM proxy's primary calls with their ``silent_model`` mirrors. Pure.

LiteLLM's router mirrors a call to a deployment's ``silent_model`` by copying the
call's kwargs, metadata included, and marking the copy ``is_silent_experiment``
(litellm/router.py, ``_get_silent_experiment_kwargs``); the copy gets a fresh
call id. So the guard's pre-call hook writes one join id into the request's
metadata, both calls carry it to the success logger, and this module pairs them
by that id: whichever arrives first waits for the other.

Sides are told apart by model group, not by which call was the mirror: the
route's candidate group is the candidate whatever mirrored what (a reference
deployment may mirror to the candidate, as a half-open probe does).

Slice tags come from the primary call's request through the gateway's one function
(``gateway/chain/slices.request_tags``); the caller's task is bounded in the pre-call hook
and travels in the metadata (``Side.task``).

A mirror that never arrives (LiteLLM has had releases where it silently did
not fire) is counted when its primary has waited ``timeout_s``; a mirror whose
primary never logged success (the user's call failed) is counted apart.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from quantdrift.gateway.chain.planning import json_spec
from quantdrift.gateway.chain.slices import request_tags
from quantdrift.gateway.openai_wire import Accumulator
from quantdrift.gateway.shadow.pairs import request_info
from quantdrift.schemas.pair import ModelOutput, PairEvent, pair_id_for

Role = Literal["candidate", "reference"]
# Request fields a pair records (decoding, JSON contract); the rest stays with LiteLLM.
REQUEST_FIELDS = (
    "messages",
    "temperature",
    "top_p",
    "max_tokens",
    "max_completion_tokens",
    "response_format",
    "expected_keys",
    "tools",
    "tool_choice",
    "functions",
    "function_call",
)


@dataclass(frozen=True, slots=True)
class RouteMap:
    """One guarded route: the model group users call and the reference's group."""

    route: str
    candidate_group: str
    reference_group: str
    candidate_precision: str = ""
    reference_precision: str = ""
    clear_prompts: bool = False


@dataclass(frozen=True, slots=True)
class Side:
    """One logged call: its model group, what it answered, and what was asked."""

    group: str
    output: ModelOutput
    request: Mapping[str, Any]
    primary: bool
    expects_mirror: bool = False
    task: str | None = None  # the caller's task, already bounded by the pre-call hook


@dataclass
class JoinStats:
    pairs: int = 0
    mirrors_missing: int = 0
    mirrors_failed: int = 0
    orphan_mirrors: int = 0
    unmapped: int = 0


@dataclass
class _Pending:
    route: RouteMap
    first_at: float
    sides: dict[Role, Side] = field(default_factory=dict)


def output_of(
    response: Mapping[str, Any], precision: str, latency_ms: float, k: int
) -> ModelOutput:
    """One side of a pair from an OpenAI-format response body, through the gateway's own
    wire folding (``Accumulator`` reads a ``message`` like a stream's ``delta``).

    >>> out = output_of({"id": "c", "model": "m", "choices": [{"index": 0,
    ...     "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}]},
    ...     "int4", 12.5, 0)
    >>> out.text, out.precision, out.finish_reason, out.latency_ms
    ('hi', 'int4', 'stop', 12.5)
    """
    acc = Accumulator(precision)
    acc.add(response)
    completion = acc.finish()
    completion.latency_ms = latency_ms
    return completion.output(k)


class PairJoiner:
    """Waiting halves by join id; ``add`` returns a PairEvent once both are in."""

    def __init__(self, routes: Iterable[RouteMap], timeout_s: float, salt: str) -> None:
        self.routes = tuple(routes)
        self.timeout_s = timeout_s
        self._salt = salt
        self._by_group: dict[str, tuple[RouteMap, Role]] = {}
        for r in self.routes:
            self._by_group[r.candidate_group] = (r, "candidate")
            self._by_group.setdefault(r.reference_group, (r, "reference"))
        self._pending: dict[str, _Pending] = {}
        self.stats = JoinStats()

    def lookup(self, group: str) -> tuple[RouteMap, Role] | None:
        """The route a model group belongs to, and its role there."""
        return self._by_group.get(group)

    def pending(self) -> int:
        return len(self._pending)

    def add(self, join_id: str, side: Side, now: float) -> PairEvent | None:
        found = self._by_group.get(side.group)
        if found is None:
            self.stats.unmapped += 1
            return None
        route, role = found
        entry = self._pending.get(join_id)
        if entry is None:
            if side.primary and not side.expects_mirror:
                return None  # nothing will come to pair with it (e.g. served while rolled back)
            entry = self._pending[join_id] = _Pending(route, now)
        entry.sides[role] = side
        if len(entry.sides) < 2:
            return None
        del self._pending[join_id]
        self.stats.pairs += 1
        return self._pair(join_id, entry)

    def mirror_failed(self, join_id: str) -> None:
        """The mirror call itself failed: its primary waits for nothing."""
        self.stats.mirrors_failed += 1
        self._pending.pop(join_id, None)

    def expire(self, now: float) -> list[str]:
        """Drop halves older than ``timeout_s``; counts them and returns their join ids."""
        gone = [j for j, e in self._pending.items() if now - e.first_at >= self.timeout_s]
        for join_id in gone:
            entry = self._pending.pop(join_id)
            if any(s.primary for s in entry.sides.values()):
                self.stats.mirrors_missing += 1
            else:
                self.stats.orphan_mirrors += 1
        return gone

    def _pair(self, join_id: str, entry: _Pending) -> PairEvent:
        cand, ref = entry.sides["candidate"], entry.sides["reference"]
        primary = cand if cand.primary else ref
        body = dict(primary.request)
        spec = json_spec(body)
        return PairEvent(
            pair_id=pair_id_for(join_id, "shadow"),
            ts=entry.first_at,
            route=entry.route.route,
            kind="shadow",
            candidate=cand.output,
            reference=ref.output,
            request=request_info(
                body,
                spec,
                clear=entry.route.clear_prompts,
                private=False,
                preference=None,
                salt=self._salt,
            ),
            sample_rate=1.0,
            tags=request_tags(
                body, expects_json=spec is not None, task=primary.task or cand.task or ref.task
            ),
        )
