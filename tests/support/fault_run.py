"""One case of the fault schedule on a fresh rig, from start to the checker's audit.

A run: Redis, the broker, a worker and a gateway each on their own host; the openai
SDK drives the gateway from the observer (every request mirrored); the route is
judged by the real worker. Then:

1. the fault goes on (``fault_cases.Case``) and stays for ``hold_s``; if the case
   says so, the candidate turns bad halfway, so a decision is due across the fault;
2. in that window the case's own behaviour is checked and the fault is proven
   (a rule's drop counter, the proxy's held chunks, an exit by SIGKILL);
3. healed, the time to recover is measured: judging moves again and the gateway
   holds the route's newest epoch (verified again, for a gateway cut from both);
4. an operator locks the route on the reference (``quantdrift route rollback``);
5. the load stops, the queues drain, and ``fault_oracle.check`` audits the run.

Every fault is healed in a ``finally`` and the rig's namespaces always go.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import redis

from support.delay_proxy import DelayProxy
from support.fault_cases import Case
from support.fault_oracle import Run, check, judged_ids, route_state
from support.gateway_process import GatewayProcess
from support.netrig import Partition, Redirect, Rig, sweep
from support.rig_stack import KAFKA_PORT, REDIS_PORT, ROUTE, Load, RigStack, wait
from support.supervisor import Supervisor
from support.topic_tap import TopicTap

HOSTS = ["redis", "broker", "worker", "worker2", "gateway"]
STALE_S = 3.0
APPLY_BOUND_S = 2.0  # the target: the newest command within 2 s of the link
DELAY_S = 0.3
LOSS_PERCENT = 5
COOLDOWN_S = 60.0  # the policy's default cool-down (open -> half_open)
STALL_AFTER_S = 60.0  # the worker's default stall_after_s (it exits 70 past it)
# The worker's designed exits past stall_after_s, each restarted by a service manager.
DESIGNED_EXITS = {
    70: "exiting (code 70)",  # a score the broker would not take (streams/delivery.py)
    69: "exiting (code 69)",  # the broker unreachable at startup (streams/broker_wait.py)
}
BROKER_DOWN_S = 5.0  # how long a restarted broker stays down, under load
HEALTHY = "The capital of France is Paris, on the Seine."
DRIFTED = "Bananas grow in bunches; twelve of them weigh about two kilos."


@dataclass
class Row:
    """One line of the fault table."""

    case: str
    expected: str
    observed: list[str] = field(default_factory=list)
    accounted: str = ""
    recover_s: float | None = None
    violations: list[str] = field(default_factory=list)
    seconds: float = 0.0
    restarts: list[str] = field(default_factory=list)  # each exit the supervisor restarted
    load: str = ""  # the machine's 1-minute load average as the fault began and ended


class Fault:
    """A fault that is on: ``proof`` says how it met traffic (read before ``heal``)."""

    def proof(self) -> str:
        raise NotImplementedError

    def heal(self) -> None:
        """Undo the fault (idempotent); a fault that ends by itself does nothing."""


@dataclass
class Cut(Fault):
    rules: list[Partition]

    def proof(self) -> str:
        counts = {f"{r.a}->{r.b}": r.packets() for r in self.rules}
        dry = [k for k, v in counts.items() if v == 0]
        assert not dry, f"the rule on {dry} dropped nothing: the fault never met traffic"
        return "dropped " + ", ".join(f"{v} packets {k}" for k, v in counts.items())

    def heal(self) -> None:
        for rule in self.rules:
            rule.heal()


@dataclass
class Delay(Fault):
    proxy: DelayProxy

    def proof(self) -> str:
        assert self.proxy.delayed > 0, "the proxy held nothing: the delay never met traffic"
        return f"{self.proxy.delayed} chunks held {DELAY_S * 500:.0f} ms each way"

    def heal(self) -> None:
        self.proxy.delay_s = 0.0


@dataclass
class KafkaDelay(Delay):
    """The delay on one client's links to the broker, whose every connection its own
    namespace redirects through the proxy (``Rig.redirect``): the broker and every
    other client untouched. Proven by one Kafka request's round trip timed from the
    client's namespace before, at the start and at the end of the window, and by the
    proxy having served that client's address only."""

    rs: RigStack
    client: str
    other: str  # another client of the broker, not slowed
    redirect: Redirect
    before: float
    at_start: float

    def proof(self) -> str:
        held = super().proof()
        at_end = self.rs.broker_round_trip(self.client)
        other = self.rs.broker_round_trip(self.other)
        mine = {self.rs.rig.addr(self.client)}
        assert self.proxy.peers == mine, f"the proxy served {self.proxy.peers}, not only {mine}"
        slowest = min(self.at_start, at_end)
        assert slowest >= DELAY_S, f"a round trip to the broker took {slowest:.3f}s under delay"
        ms = [f"{v * 1000:.1f}" for v in (self.before, self.at_start, at_end, other)]
        return (
            f"{held}; {self.redirect.connections()} connections of the {self.client} "
            f"redirected, no other host's; one Kafka request {self.client}->broker "
            f"{ms[0]} ms before, {ms[1]} ms at the start, {ms[2]} ms at the end; "
            f"{self.other}->broker {ms[3]} ms"
        )


@dataclass
class Exited(Fault):
    """A part killed by SIGKILL: its exit status, and the line that says where."""

    what: str
    status: Callable[[], int | None]
    line: Callable[[], bool] = lambda: True

    def proof(self) -> str:
        status = wait_for(self.status, 90, f"{self.what} to exit")
        assert status == -9, f"{self.what} exited {status}, not by SIGKILL"
        assert self.line(), f"{self.what}: no line saying where it was killed"
        return f"{self.what} exited by SIGKILL"


@dataclass
class BrokerRestarted(Exited):
    """The broker killed and back empty: what it had acknowledged, what the tap kept."""

    bench: Bench | None = None
    back_s: float = 0.0

    def proof(self) -> str:
        bench = self.bench
        assert bench is not None and bench.tap is not None and bench.sent_at_loss is not None
        assert bench.rs.settings is not None
        pairs, tap = bench.rs.settings.kafka.topics.pairs, bench.tap
        return (
            f"{super().proof()}; back with its topics made again {self.back_s:.1f}s after; "
            f"{bench.sent_at_loss:.0f} pairs acknowledged before the death, "
            f"{tap.count(pairs, 0)} of them read by the tap; "
            f"{tap.count(pairs, tap.generation)} pairs on the new broker by the window's end"
        )


def wait_for(get: Callable[[], Any], timeout: float, what: str) -> Any:
    """Poll ``get`` until it returns something other than None."""
    found: list[Any] = []
    wait(lambda: found.append(get()) or found[-1] is not None, timeout, what)
    return found[-1]


@dataclass
class Bench:
    """The parts of one run and the observer's readers over them."""

    case: Case
    rs: RigStack
    gw: GatewayProcess
    proxy: DelayProxy | None
    worker: Supervisor | None = None  # the first worker, restarted whenever it fails
    fault_on: float = 0.0  # monotonic time the fault went on
    redirect: Redirect | None = None  # the slowed client's connections to the broker
    load: Load | None = None
    tap: TopicTap | None = None  # the topics kept as they land (a broker restart forgets)
    sent_at_loss: float | None = None  # the gateway's acknowledged sends at the broker's death
    judged_at_loss: int = 0
    opened_epoch: int = 0  # the rollback's epoch, for a case that opens the route first
    direct: redis.Redis = field(init=False)

    def __post_init__(self) -> None:
        self.direct = redis.Redis.from_url(self.rs.redis_url, socket_timeout=5)

    @property
    def prefix(self) -> str:
        assert self.rs.settings is not None
        return self.rs.settings.redis.key_prefix

    def judged(self) -> int:
        """Pairs the judge folded so far (the route's ``seen`` keys), or -1 if unreadable."""
        try:
            return sum(len(v) for v in judged_ids(self.direct, self.prefix, ROUTE).values())
        except redis.RedisError:
            return -1

    def state(self) -> dict[str, Any]:
        try:
            return route_state(self.direct, self.prefix, ROUTE)
        except redis.RedisError:
            return {}

    def applied(self) -> bool:
        """The gateway holds the route's newest epoch."""
        want = int(self.state().get("epoch", 0))
        return bool(self.gw.health()["routes"][ROUTE]["epoch"] == want)


def start(case: Case, rs: RigStack, hold_s: float) -> Bench:
    """Redis, broker, upstream, (proxy), worker, gateway, load; judging under way."""
    restarts = case.fault == "broker_restart"
    # 4 partitions where the broker restarts: what it makes of a topic a client asks for
    # before the topics are made again.
    rs.start_redis().start_broker(4 if restarts else 2).start_upstream()
    assert rs.upstream is not None
    rs.upstream.texts.update({"int4": HEALTHY, "bf16": HEALTHY})
    worker_env: dict[str, str] = {}
    gw_env: dict[str, str] = {}
    gw_extra: dict[str, Any] = {}
    proxy, redirect = None, None
    observer = rs.rig.addr("observer")
    if case.fault == "delay" and case.b == "broker":
        # Before the client starts: a redirect only takes connections opened after it.
        proxy = DelayProxy(observer, rs.rig.addr("broker"), KAFKA_PORT).start()
        redirect = rs.rig.redirect(case.a, "broker", KAFKA_PORT, (observer, proxy.port))
    elif case.fault == "delay":
        to_redis = case.b == "redis"
        target = (rs.rig.addr("redis"), REDIS_PORT) if to_redis else (observer, rs.upstream.port)
        proxy = DelayProxy(observer, *target).start()
        if to_redis:
            env = worker_env if case.a == "worker" else gw_env
            env["QUANTDRIFT_REDIS__URL"] = f"redis://{proxy.address}"
        else:
            base = f"http://{proxy.address}"
            gw_extra["precisions"] = {"int4": [f"{base}/int4"], "bf16": [f"{base}/bf16"]}
    if case.may_exit:
        # The cut outlasts stall_after_s at any hold (the default at the default hold),
        # so the exit and the restart are exercised whenever a score is in flight.
        stall = str(min(STALL_AFTER_S, hold_s / 2))
        worker_env["QUANTDRIFT_WORKER__STALL_AFTER_S"] = stall
    worker = rs.supervise_worker(**worker_env)
    gw = rs.start_gateway(env=gw_env, shadow_sample_rate=1.0, control_stale_s=STALE_S, **gw_extra)
    bench = Bench(case, rs, gw, proxy, worker, redirect=redirect)
    if restarts:
        assert rs.settings is not None
        bench.tap = TopicTap(rs.bootstrap, list(rs.settings.kafka.topics.model_dump().values()))
        bench.tap.start()
    wait(lambda: gw.health()["kafka_connected"], 60, "the gateway's publisher")
    bench.load = Load(gw.url, temperature=0.0).start()
    wait(lambda: bench.judged() >= 10, 180, f"the worker judging\n{rs.log('worker-worker')}")
    return bench


def open_route(bench: Bench, row: Row) -> None:
    """The candidate turns bad before the fault: the route rolled back and applied."""
    assert bench.rs.upstream is not None
    bench.rs.upstream.texts["int4"] = DRIFTED
    wait(lambda: int(bench.state().get("trips", 0)) >= 1, 90, "the rollback before the fault")
    wait(bench.applied, 30, "the gateway applying the rollback before the fault")
    bench.opened_epoch = int(bench.state().get("epoch", 0))
    row.observed.append(f"rolled back before the fault (epoch {bench.opened_epoch})")


def inject(bench: Bench) -> Fault:
    case, rs = bench.case, bench.rs
    if case.fault == "partition":
        return Cut([rs.rig.partition(case.a, b) for b in case.b.split("+")])
    if case.fault == "loss":
        return Cut([rs.rig.lossy(case.a, case.b, LOSS_PERCENT)])
    if case.fault == "delay":
        assert bench.proxy is not None
        if bench.redirect is None:
            bench.proxy.delay_s = DELAY_S
            return Delay(bench.proxy)
        before = rs.broker_round_trip(case.a)
        bench.proxy.delay_s = DELAY_S
        at_start = rs.broker_round_trip(case.a)
        other = "gateway" if case.a == "worker" else "worker"
        return KafkaDelay(bench.proxy, rs, case.a, other, bench.redirect, before, at_start)
    if case.fault == "redis_restart":
        status = rs.restart_redis()
        return Exited("Redis", lambda: status)
    if case.fault == "broker_restart":
        return restart_broker(bench)
    if case.fault == "worker_kill":
        proc = rs.start_worker(host="worker2", QUANTDRIFT_WORKER__FAILPOINTS='["send_score"]')
        return Exited(
            "the second worker",
            proc.poll,
            lambda: "failpoint send_score: SIGKILL" in rs.log("worker-worker2", 100_000),
        )
    raise ValueError(f"unknown fault {case.fault!r}")


def restart_broker(bench: Bench) -> Fault:
    """SIGKILL the broker under load, keep it down ``BROKER_DOWN_S``, start it empty."""
    tap = bench.tap
    assert tap is not None

    def while_down() -> None:
        down = time.monotonic()
        tap.restarted()
        time.sleep(0.5)  # an acknowledgement received before the death is counted by now
        bench.sent_at_loss = bench.gw.metric("quantdrift_gateway_pairs_sent_total")
        bench.judged_at_loss = bench.judged()
        time.sleep(max(0.0, BROKER_DOWN_S - (time.monotonic() - down)))

    killed = time.monotonic()
    status = bench.rs.restart_broker(while_down)
    tap.wait_reading()
    back = time.monotonic() - killed
    return BrokerRestarted("the broker", lambda: status, bench=bench, back_s=back)


def hold(bench: Bench, fault: Fault, hold_s: float, rng: random.Random, row: Row) -> float | None:
    """Keep the fault on for ``hold_s``; drift if the case says so; check the window.
    After a Redis restart: the seconds until the first pair was folded on the new one."""
    case, assert_ = bench.case, row.violations.append
    begin, judged_at_start = time.monotonic(), bench.judged()
    bench.fault_on, load_on = begin, os.getloadavg()[0]
    drift_at = begin + hold_s * rng.uniform(0.3, 0.6) if case.drift else None
    grace = min(5.0, hold_s / 3)  # what the worker held when the fault began may still land
    settled: int | None = None
    resumed: float | None = None
    worst_lag = (0.0, 0.0)  # the gateway's event-loop lag: it sheds users past 0.5 s
    modes: set[str] = set()  # what the gateway did with the route during the window
    stale_seen = False
    dropped0 = bench.gw.metric("quantdrift_gateway_shadow_dropped_total", stage="publish")
    sent0 = bench.gw.metric("quantdrift_gateway_pairs_sent_total")
    load_start = _answers(bench)[0][0] if _answers(bench) else begin
    row.observed.append(f"fault on at +{begin - load_start:.1f}s of load for {hold_s:.0f}s")
    while (now := time.monotonic()) < begin + hold_s:
        if drift_at is not None and now >= drift_at:
            assert bench.rs.upstream is not None
            bench.rs.upstream.texts["int4"] = DRIFTED
            row.observed.append(f"drift at +{now - begin:.0f}s")
            drift_at = None
        if settled is None and now >= begin + grace:
            settled = bench.judged()
        if case.fails_closed:
            stale_seen = stale_seen or bool(bench.gw.health()["control_stale"])
        if case.fault == "redis_restart" and resumed is None and bench.judged() > 0:
            resumed = time.monotonic() - begin
        if case.open_first:
            modes.add(bench.gw.health()["routes"][ROUTE]["mode"])
        lag = bench.gw.metric("quantdrift_gateway_loop_lag_seconds")
        if lag > worst_lag[0]:
            worst_lag = (lag, now - begin)
        time.sleep(0.25)
    judged_at_end = bench.judged()
    row.load = f"{load_on:.1f}-{os.getloadavg()[0]:.1f}"
    row.observed.append(fault.proof())
    row.observed.append(f"gateway loop lag at most {worst_lag[0]:.2f}s (+{worst_lag[1]:.0f}s)")
    if case.stops_judging:
        moved = judged_at_end - (settled or judged_at_end)
        row.observed.append(f"{moved} pairs judged in the cut's last {hold_s - grace:.0f}s")
        if moved:
            assert_(f"the worker judged {moved} pairs while cut off")
    elif case.fault in ("loss", "delay", "worker_kill", "redis_restart", "broker_restart") and (
        case.a != "gateway"
    ):
        grew = judged_at_end - max(judged_at_start, 0)
        row.observed.append(f"{grew} pairs judged during the fault")
        if case.fault != "redis_restart" and grew <= 0:
            assert_("no pair judged during a fault that should only slow judging")
    if case.fault == "delay" and case.a == "gateway" and case.b == "broker":
        sent = bench.gw.metric("quantdrift_gateway_pairs_sent_total") - sent0
        row.observed.append(f"{sent:.0f} pairs sent through the slowed link")
        if sent <= 0:
            assert_("no pair reached the broker through a link that was only slow")
    if case.fails_closed:
        answers = [a for a in _answers(bench) if begin + STALE_S + 3 <= a[0] <= begin + hold_s]
        kinds = sorted({p for _, s, p in answers if s == 200})
        row.observed.append(f"stale seen: {stale_seen}; served after the bound: {kinds}")
        if not stale_seen or kinds != ["bf16"]:
            assert_(f"did not fail closed (stale {stale_seen}, served {kinds})")
    if case.a == "gateway" and case.b == "broker" and case.fault == "partition":
        dropped = bench.gw.metric("quantdrift_gateway_shadow_dropped_total", stage="publish")
        row.observed.append(f"{dropped - dropped0:.0f} pairs dropped stage=publish")
        if dropped <= dropped0:
            assert_("no pair counted as dropped while the broker was cut off")
    if case.fault == "redis_restart" and case.open_first:
        state, applied = bench.state(), bench.gw.health()["routes"][ROUTE]
        row.observed.append(
            f"after the loss and {hold_s:.0f}s: breaker state {state.get('state')} "
            f"epoch {state.get('epoch')}; the gateway's modes {sorted(modes)}, "
            f"epoch {applied['epoch']}"
        )
        log = bench.rs.log("worker-worker", 1_000_000)
        row.observed.append(f"worker says rebuilt: {'rebuilt from the control topic' in log}")
        # Past the cool-down the breaker half-opens (a newer epoch), whether the probe
        # then restores or re-opens; one that forgot the route never moves again.
        # Shorter than the cool-down: the rebuilt state carries the rollback's epoch.
        epoch = int(state.get("epoch", 0))
        past = hold_s >= COOLDOWN_S + 15
        moved = epoch > bench.opened_epoch if past else epoch >= bench.opened_epoch
        if state.get("state") not in ("open", "half_open", "closed") or not moved:
            assert_(
                "after losing its state the breaker no longer knows the route is open "
                f"(state {state.get('state', 'absent')}, epoch {state.get('epoch')}); the "
                f"gateway stayed {sorted(modes)} for {hold_s:.0f}s with nothing to half-open it"
            )
        resumed = 0.0
    elif case.fault == "redis_restart":
        row.observed.append(f"state lost: the first pair folded {resumed}s after the restart")
        if resumed is None:
            assert_("no pair judged on the restarted Redis during the window")
    return resumed


def _answers(bench: Bench) -> list[tuple[float, int, str]]:
    return list(bench.load.seen) if bench.load is not None else []


def recover(bench: Bench, row: Row, resumed_s: float | None) -> None:
    """From healing until the judge has caught up with every pair sent before it and
    the gateway holds the newest epoch. After a Redis restart there is nothing to heal:
    ``resumed_s`` (from the restart to the first pair folded on the empty Redis) is it."""
    healed = time.monotonic()
    sent = bench.gw.metric("quantdrift_gateway_pairs_sent_total")
    if resumed_s is None and bench.sent_at_loss is not None:
        # Pairs the dead broker held unjudged are gone with it: every pair sent since.
        after = sent - bench.sent_at_loss
        try:
            wait(lambda: bench.judged() - bench.judged_at_loss >= after, 90, "the new broker")
        except AssertionError as exc:
            got = bench.judged() - bench.judged_at_loss
            raise AssertionError(f"{exc}: {got} of {after:.0f} pairs sent since judged") from exc
        resumed_s = time.monotonic() - healed
    elif resumed_s is None:
        wait(lambda: bench.judged() >= sent, 90, f"judging caught up after {bench.case.name}")
        resumed_s = time.monotonic() - healed
    wait(lambda: not bench.gw.health()["control_stale"], 30, "the control state verified")
    wait(bench.applied, 90, f"the gateway on the newest epoch after {bench.case.name}")
    row.recover_s = round(max(resumed_s, time.monotonic() - healed), 2)
    state = bench.state()
    row.observed.append(
        f"judging caught up {resumed_s:.2f}s after; the gateway on epoch "
        f"{state.get('epoch')} ({state.get('state')}) {time.monotonic() - healed:.2f}s after"
    )
    if bench.case.drift:
        wait(lambda: int(bench.state().get("trips", 0)) >= 1, 90, "the drift's rollback")
        wait(bench.applied, 30, "the gateway applying the rollback")
        row.observed.append(f"rolled back (epoch {bench.state().get('epoch')})")


def lock(bench: Bench, row: Row) -> float:
    """``quantdrift route rollback``, as an operator runs it; the time it returned."""
    env = {**os.environ, **bench.rs.env()}
    argv = [sys.executable, "-m", "quantdrift", "route", "rollback", "--route", ROUTE]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"route rollback: {done.stdout}{done.stderr}"
    at = time.monotonic()
    took = wait(lambda: bool(bench.state().get("locked")) and bench.applied(), 30, "the lock")
    row.observed.append(f"lock applied by the gateway {took:.2f}s after the CLI returned")
    if took > APPLY_BOUND_S:
        row.violations.append(f"the lock reached the gateway after {took:.2f}s")
    wait(lambda: sum(1 for a in _answers(bench) if a[0] > at + APPLY_BOUND_S) >= 5, 30, "load")
    return at


def drain(bench: Bench) -> None:
    """Stop the load, empty the gateway's queues, wait for the judge to catch up."""
    assert bench.load is not None
    bench.load.stop()
    gw = bench.gw
    wait(lambda: gw.health()["shadow_queue"] == 0 == gw.health()["shadow_in_flight"], 60, "idle")
    wait(lambda: gw.metric("quantdrift_gateway_pairs_queue_depth") == 0, 60, "queue drained")
    if bench.case.fault == "redis_restart":
        # The seen keys of pairs judged before the loss are gone: wait until judging
        # settles (3 s without a new one); the checker accounts for those by their scores.
        last = [bench.judged(), time.monotonic()]

        def settled() -> bool:
            n = bench.judged()
            if n != last[0]:
                last[:] = [n, time.monotonic()]
            return time.monotonic() - last[1] >= 3.0

        wait(settled, 120, "judging settled")
        return
    sent, base = gw.metric("quantdrift_gateway_pairs_sent_total"), 0
    if bench.sent_at_loss is not None:  # what the dead broker held unjudged is gone with it
        sent, base = sent - bench.sent_at_loss, bench.judged_at_loss
    with contextlib.suppress(AssertionError):  # the checker says which pairs are missing
        wait(lambda: bench.judged() - base >= sent, 120, "the judge catching up")


def latency_line(bench: Bench, healed_at: float) -> str:
    """The users' latency over the run and in the 30 s after healing, when a worker
    catches up its backlog on the cores the gateway shares."""
    assert bench.load is not None
    whole = [d for _, d in list(bench.load.latency)]
    after = [d for t, d in list(bench.load.latency) if healed_at <= t <= healed_at + 30]

    def cut(xs: list[float]) -> str:
        if not xs:
            return "none"
        xs = sorted(xs)
        p = [xs[min(len(xs) - 1, int(q * len(xs)))] * 1000 for q in (0.5, 0.99)]
        return f"p50 {p[0]:.0f} ms, p99 {p[1]:.0f} ms, max {xs[-1] * 1000:.0f} ms ({len(xs)})"

    nice = f" (worker nice {bench.rs.worker_nice})" if bench.rs.worker_nice else ""
    return f"user latency{nice}: {cut(whole)}; 30 s after healing: {cut(after)}"


def restarts(bench: Bench, row: Row) -> None:
    """The supervisor's restarts, in the row; a breach unless the case allows the
    worker's designed exits (70: a score undelivered for stall_after_s; 69: the broker
    unreachable at startup for as long) and the exit was one of them."""
    sup = bench.worker
    assert sup is not None
    since = bench.fault_on or time.monotonic()
    row.restarts = sup.describe(since)
    row.observed += row.restarts
    log = bench.rs.log("worker-worker", 10_000_000)
    said = {code: log.count(line) for code, line in DESIGNED_EXITS.items()}
    for r in sup.restarts:
        if r.status not in DESIGNED_EXITS or not bench.case.may_exit:
            row.violations.append(
                f"{sup.name} exited {r.status} at {r.exited_at - since:+.1f}s of the fault "
                f"(restarted by the supervisor): not the designed exit this case allows"
            )
    if sup.restarts:
        row.observed.append(
            "the worker's log says why: "
            + ", ".join(f"'{DESIGNED_EXITS[c]}' {n} times" for c, n in said.items())
        )
    if sup.gave_up:
        row.violations.append(f"{sup.name}: the supervisor gave up after {sup.burst} restarts")


def run_case(case: Case, hold_s: float, seed: int, worker_nice: int = 0) -> Row:
    """The whole case on a fresh rig; the row of the fault table."""
    rng = random.Random(f"{seed}:{case.name}")
    row, started = Row(case.name, case.expected), time.monotonic()
    sweep()
    with Rig(HOSTS) as rig:
        rs = RigStack(rig, worker_nice=worker_nice)
        bench: Bench | None = None
        fault: Fault | None = None
        try:
            bench = start(case, rs, hold_s)
            if case.open_first:
                open_route(bench, row)
            fault = inject(bench)
            resumed = hold(bench, fault, hold_s, rng, row)
            fault.heal()
            healed_at = time.monotonic()
            recover(bench, row, resumed)
            locked_at = lock(bench, row)
            drain(bench)
            assert rs.settings is not None
            audit = check(
                Run(
                    bootstrap=rs.bootstrap,
                    topics=rs.settings.kafka.topics.model_dump(),
                    redis_url=rs.redis_url,
                    prefix=bench.prefix,
                    route=ROUTE,
                    gateways=[bench.gw],
                    answers=_answers(bench),
                    errors=list(bench.load.errors) if bench.load is not None else [],
                    locked_at=locked_at,
                    apply_bound_s=APPLY_BOUND_S,
                    state_lost=case.fault == "redis_restart",
                    tap=bench.tap,
                    sent_at_loss=bench.sent_at_loss,
                )
            )
            row.observed.append(latency_line(bench, healed_at))
            row.accounted = audit.accounted
            row.violations += audit.violations
            row.observed.append(
                f"{audit.requests} requests; {audit.commands} commands"
                f" ({audit.republished} republished); duplicates: {audit.topic_duplicates}"
                f" on the pairs topic, {audit.scores_duplicates} scores"
            )
        except AssertionError as exc:
            row.violations.append(f"{type(exc).__name__}: {exc}"[:2000])
            for name in ("worker-worker", "gateway-gateway", "worker-worker2"):
                row.violations.append(f"--- {name} log ---\n{rs.log(name, 2500)}")
        finally:
            if bench is not None and bench.worker is not None:
                restarts(bench, row)
            if fault is not None:
                fault.heal()
            if bench is not None and bench.load is not None:
                bench.load.stop()
            if bench is not None and bench.proxy is not None:
                bench.proxy.stop()
            if bench is not None and bench.tap is not None:
                bench.tap.stop()
            rs.close()
            if not row.violations:  # a failed case keeps its parts' logs for reading
                shutil.rmtree(rs.workdir, ignore_errors=True)
    row.seconds = round(time.monotonic() - started, 1)
    return row
