"""Per-route breaker: pure transitions (machine), the Redis store (Lua), in-memory twin,
and the offline driver that replay and eval fold recordings with."""

from quantdrift.breaker.machine import Decision, initial_state, judge, manual, tick
from quantdrift.breaker.memory_store import MemoryBreakerStore
from quantdrift.breaker.offline import StreamFold, Trip, offline_store
from quantdrift.breaker.outbox import Outbox, build_outbox
from quantdrift.breaker.policy import Policy, RoutePolicy, load_policy
from quantdrift.breaker.protocol import BreakerStore, Claim, FoldResult
from quantdrift.breaker.relay import OutboxRelay
from quantdrift.breaker.state import RouteState, Transition, WorstPair

__all__ = [
    "BreakerStore",
    "Claim",
    "Decision",
    "FoldResult",
    "MemoryBreakerStore",
    "Outbox",
    "OutboxRelay",
    "Policy",
    "RoutePolicy",
    "RouteState",
    "StreamFold",
    "Transition",
    "Trip",
    "WorstPair",
    "build_outbox",
    "initial_state",
    "judge",
    "load_policy",
    "manual",
    "offline_store",
    "tick",
]
