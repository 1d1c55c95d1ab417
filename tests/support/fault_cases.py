"""The fault schedule's cases: what each one does to the rig, and what it must leave.

A case names a fault on one link or one part, the behaviour it expects (stated in
``expected``, checked in the window that matters by ``fault_run``), and whether the
route drifts while it is on, so that a decision has to be made across the fault.
Every fault is bounded: it lasts the schedule's hold and is undone by ``heal``
(a partition's table deleted, the proxy's delay set to 0); ``fault_run`` heals in
a ``finally``, and the rig's teardown deletes every namespace whatever happened.

The short schedule (``SHORT``) runs in ``make test``; ``make bench-faults`` runs
every case (``CASES``) for minutes each, in an order drawn from a seed.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Case:
    name: str
    expected: str
    fault: str  # partition | loss | delay | redis_restart | broker_restart | worker_kill
    a: str = ""  # the link's side whose namespace holds the rule (or the proxy's client)
    b: str = ""  # the other side: a host, or "upstream" (the observer's scripted LLM)
    drift: bool = False  # the candidate turns bad halfway through the fault
    stops_judging: bool = False  # the worker can judge nothing while it is on
    fails_closed: bool = False  # the gateway loses both control sources
    open_first: bool = False  # the route is rolled back before the fault goes on
    # The worker may exit 70 or 69 (a score undelivered, or the broker unreachable at
    # startup, for stall_after_s) and be restarted by the rig's supervisor; in any other
    # case a worker's exit is a breach.
    may_exit: bool = False

    @property
    def title(self) -> str:
        link = f"{self.a} <-> {self.b}" if self.b else self.a
        return f"{self.fault} {link}".strip()


CASES: tuple[Case, ...] = (
    Case(
        "gateway-redis",
        "the control topic keeps the route verified; users served; pairs flow",
        "partition", "gateway", "redis", drift=True,
    ),
    Case(
        "gateway-broker",
        "users served; pairs the publisher cannot send are dropped with stage=publish; "
        "the Redis key carries commands",
        "partition", "gateway", "broker", drift=True,
    ),
    Case(
        "gateway-both",
        "last verified state for control_stale_s, then every route on the reference; "
        "verified again within 2 s of healing",
        "partition", "gateway", "redis+broker", fails_closed=True,
    ),
    Case(
        "worker-broker",
        "the worker judges nothing while cut (no progress in the window); a score in "
        "flight past stall_after_s makes it exit 70 and the supervisor start it again; "
        "the new one waits for the broker (exit 69 if it stays away as long); healed, it "
        "rejoins and judges every waiting pair once; the decision lands after healing",
        "partition", "worker", "broker", drift=True, stops_judging=True, may_exit=True,
    ),
    Case(
        "worker-redis",
        "a worker cut from Redis stops judging (no pair folded in the window, its errors "
        "logged); healed, it judges every pair once and decides once",
        "partition", "worker", "redis", drift=True, stops_judging=True,
    ),
    Case(
        "redis-restart",
        "Redis SIGKILLed and back empty under load: users served from the control "
        "topic; the worker folds again on an empty state; epochs still grow",
        "redis_restart", "redis", drift=True,
    ),
    Case(
        "redis-restart-open",
        "Redis SIGKILLed and back empty while the route is rolled back: users stay on "
        "the reference, and the breaker still knows the route is open, so it half-opens "
        "after the cool-down as it would have without the loss",
        "redis_restart", "redis", open_first=True,
    ),
    Case(
        "broker-restart",
        "the broker SIGKILLed under load, down 5 s, back empty (its storage is memory): "
        "users served throughout; pairs sent while it was down are on the new broker or "
        "dropped stage=publish; what the dead broker held unjudged is lost with it, "
        "within what it acknowledged; the worker judges the new broker's pairs; no "
        "decision twice",
        "broker_restart", "broker", drift=True,
    ),
    Case(
        "worker-kill",
        "a second worker SIGKILLed while it holds a scored batch: the first takes its "
        "partitions back, each redelivered pair judged once, exactly one transition",
        "worker_kill", "worker2", drift=True,
    ),
    Case(
        "delay-worker-redis",
        "300 ms on each round trip to Redis: judging slows, nothing lost or doubled",
        "delay", "worker", "redis", drift=True,
    ),
    Case(
        "delay-gateway-redis",
        "300 ms to Redis: the topic carries commands; users unaffected",
        "delay", "gateway", "redis", drift=True,
    ),
    Case(
        "delay-worker-broker",
        "300 ms on each round trip between the worker and the broker (its connections "
        "redirected through the proxy, the broker and the gateway untouched): judging "
        "slows, nothing lost or doubled, the decision lands once",
        "delay", "worker", "broker", drift=True,
    ),
    Case(
        "delay-gateway-broker",
        "300 ms between the gateway and the broker (its connections redirected through "
        "the proxy): pairs still sent, commands arrive later; users unaffected",
        "delay", "gateway", "broker", drift=True,
    ),
    Case(
        "delay-gateway-upstream",
        "300 ms on the users' own path: every answer 200, pairs flow",
        "delay", "gateway", "upstream",
    ),
    Case(
        "loss-worker-broker",
        "5 % loss: TCP retransmits; judging goes on; every pair judged once",
        "loss", "worker", "broker", drift=True,
    ),
    Case(
        "loss-worker-redis",
        "5 % loss: Lua steps retried or redone, never doubled",
        "loss", "worker", "redis", drift=True,
    ),
    Case(
        "loss-gateway-broker",
        "5 % loss: pairs sent or dropped with a reason; commands still arrive",
        "loss", "gateway", "broker", drift=True,
    ),
    Case(
        "loss-gateway-redis",
        "5 % loss: the route stays verified; users unaffected",
        "loss", "gateway", "redis",
    ),
)  # fmt: skip

BY_NAME = {case.name: case for case in CASES}

# make test: a worker's cut link, a kill holding a batch, loss, and the Redis loss that
# once stranded a rolled-back route (the delays run in the long schedule).
SHORT = ("worker-redis", "worker-kill", "loss-worker-broker", "redis-restart-open")
