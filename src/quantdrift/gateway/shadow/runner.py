"""The shadow runner: mirror sampled requests to the other side, isolated from users.

Isolation, piece by piece:

* its own ``Upstreams`` (own clients, ``shadow_max_connections`` per pool),
  so a shadow call never takes a user's connection, and a slow reference that
  fills the shadow pool cannot queue users behind it;
* a bounded queue (``shadow_queue``, a few hundred) that drops the **oldest**
  job when full: the newest requests are the ones worth mirroring, and memory
  stays flat whatever the reference does; every drop is counted by reason;
* queued jobs hold the user's answer **stripped** (choice 0, top-k log-probs
  the pair needs), not the full upstream payload, and the request body only when
  it is at most ``limits.max_shadow_body_bytes`` (larger ones are not mirrored,
  counted ``too_large``): the queue holds at most ``shadow_queue`` such bodies;
* ``shadow_concurrency`` workers, each job under one deadline
  (``timeouts.shadow_total_s``, 30 s by default);
* the route's state is **re-checked before each call**: a candidate rolled back
  while the job waited is not called;
* nothing here runs on a user's request path: ``submit`` only appends to a
  deque, and every failure stays in this module (counted, logged).

Two callers, one pair builder. The gateway submits a job with the answer its user
got (that side is not asked again); the collector (``collector.py``), behind a
gateway it does not own, submits a job with no answer, and the runner asks both
sides itself. ``mirrored_share`` is the share of a route's traffic that reaches this
runner's sampling at all (1 in the gateway; in a collector, what the gateway in
front mirrors to it), so a pair's ``sample_rate`` is its share of the route's traffic.

Prompts leave as the salted hash of ``schemas/privacy.py`` (HMAC-SHA256 with
``prompt_salt``) unless the route opts in with ``clear_prompts``; a request
marked private never carries its prompt. What else a pair carries, private or
not, is in docs/privacy.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from quantdrift.errors import GatewayOverloaded, UpstreamError
from quantdrift.gateway.chain.planning import JsonSpec, Plan
from quantdrift.gateway.chain.routing import RouteDirective, decide
from quantdrift.gateway.gateway_config import GatewayConfig
from quantdrift.gateway.openai_wire import Accumulator, Completion
from quantdrift.gateway.telemetry import counter, gauge
from quantdrift.gateway.upstream.pools import UpstreamClientError, Upstreams, error_reason
from quantdrift.gateway.upstream.teacher_forcing import UNSUPPORTED, Scored
from quantdrift.schemas.pair import EngineInfo, ModelOutput, PairEvent, RequestInfo, pair_id_for
from quantdrift.schemas.privacy import prompt_hash
from quantdrift.supervision import Supervisor, cancelled

log = logging.getLogger(__name__)

# Drop reasons (quantdrift_gateway_shadow_dropped_total{stage="queue",reason}).
QUEUE_FULL = "queue_full"
ROLLED_BACK = "route_rolled_back"
DEADLINE = "deadline"
STOPPED = "stopped"
STOPPED_IN_FLIGHT = "stopped_in_flight"
TOO_LARGE = "too_large"  # request body past limits.max_shadow_body_bytes: not mirrored
PROBE_EVERY_S = 30.0


@dataclass(frozen=True, slots=True)
class ShadowJob:
    plan: Plan
    user: Completion | None  # stripped: only what the pair needs; None: ask both sides
    queued_at: float


def prompt_text(messages: Any) -> str | None:
    """The chat as text for the pair: ``role: content`` lines (multimodal parts: their text)."""
    if not isinstance(messages, list):
        return None
    lines = []
    for m in messages:
        if not isinstance(m, dict):
            continue
        content = m.get("content")
        if isinstance(content, list):
            content = " ".join(
                str(p.get("text", "")) for p in content if isinstance(p, dict) and "text" in p
            )
        lines.append(f"{m.get('role', 'user')}: {content or ''}")
    return "\n".join(lines)[:200_000]


class ShadowRunner:
    """Queue, workers and pair building for shadow and noise pairs."""

    def __init__(
        self,
        config: GatewayConfig,
        upstreams: Upstreams,
        offer: Callable[[PairEvent], Any] | None,
        directive_of: Callable[[str], RouteDirective | None],
        *,
        prompt_salt: str,
        clock: Callable[[], float] = time.monotonic,
        mirrored_share: float = 1.0,
    ) -> None:
        if not 0.0 < mirrored_share <= 1.0:
            raise ValueError(f"mirrored_share must be in (0, 1], got {mirrored_share}")
        self.config = config
        self.mirrored_share = mirrored_share
        self.upstreams = upstreams
        self._offer = offer
        self._directive_of = directive_of
        self._salt = prompt_salt
        self._clock = clock
        self._queue: deque[ShadowJob] = deque()
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._workers: list[asyncio.Task[None]] = []
        self.in_flight = 0
        self.dropped: dict[str, int] = {}
        self.errors: dict[tuple[str, str, str], int] = {}
        self.offered = 0
        self._closed = False
        # Restarts a worker loop that raises; the gateway shares its own.
        self.supervisor = Supervisor()
        self._tf_logged: set[tuple[str, str]] = set()
        # Per pool: what serves it (refreshed), and whether it can teacher-force
        # (1/0, absent while unknown): probed at start, see ``_probe_loop``.
        self.identities: dict[str, EngineInfo] = {}
        self.tf_ready: dict[str, float] = {}
        self.engine_changes: dict[str, int] = {}
        self._probe_task: asyncio.Task[None] | None = None

    # -- the user's side: never blocks, never raises --------------------------------

    def admit(self, plan: Plan, body_bytes: int) -> Plan:
        """The plan as the runner may take it: a sampled request whose body is past
        ``limits.max_shadow_body_bytes`` is not mirrored (counted ``too_large``), so the
        queue's memory stays within ``shadow_queue`` x ``max_shadow_body_bytes``."""
        if (plan.shadow or plan.noise) and body_bytes > self.config.limits.max_shadow_body_bytes:
            self._drop(TOO_LARGE)
            return dataclasses.replace(plan, shadow=False, noise=False)
        return plan

    def submit(self, plan: Plan, user: Completion | None) -> None:
        """Queue one job; the oldest is dropped (and counted) when the queue is full.

        ``user``: the answer the user got (that side is not asked again), or None when
        the caller served no one (the collector): both sides are asked.
        """
        try:
            if self._closed:
                self._drop(STOPPED)
                return
            if len(self._queue) >= self.config.shadow_queue:
                self._queue.popleft()
                self._drop(QUEUE_FULL)
            kept = None if user is None else user.stripped(self.config.top_logprobs)
            self._queue.append(ShadowJob(plan, kept, self._clock()))
            self._idle.clear()
            self._wake.set()
        except Exception:  # the user's request must not fail because of the mirror
            log.exception("shadow job not queued")

    def _drop(self, reason: str) -> None:
        self.dropped[reason] = self.dropped.get(reason, 0) + 1

    def _error(self, route: str, kind: str, reason: str) -> None:
        key = (route, kind, reason)
        self.errors[key] = self.errors.get(key, 0) + 1

    @property
    def depth(self) -> int:
        return len(self._queue)

    # -- lifecycle -------------------------------------------------------------------

    async def start(self) -> None:
        if self._probe_task is None:
            self._probe_task = asyncio.create_task(self._probe_loop(), name="quantdrift-probe")
        if not self._workers:
            self._closed = False
            self._workers = [
                self.supervisor.spawn(f"shadow-worker-{i}", self._work)
                for i in range(self.config.shadow_concurrency)
            ]

    async def wait_idle(self, timeout: float) -> bool:
        """True once the queue is empty and no job runs (tests, shutdown)."""
        try:
            async with asyncio.timeout(timeout):
                while self._queue or self.in_flight:
                    self._idle.clear()
                    await self._idle.wait()
        except TimeoutError:
            return False
        return True

    async def stop(self, timeout: float = 5.0) -> None:
        """Refuse new jobs, let queued and running ones finish for ``timeout`` s, then
        cancel the rest: each counted (``stopped`` queued, ``stopped_in_flight``
        running) and reported in one log line."""
        self._closed = True
        await cancelled(self._probe_task)
        self._probe_task = None
        drained = await self.wait_idle(timeout)
        running, queued = self.in_flight, len(self._queue)
        for task in self._workers:
            task.cancel()
        for task in self._workers:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._workers = []
        if queued:
            self.dropped[STOPPED] = self.dropped.get(STOPPED, 0) + queued
            self._queue.clear()
        if running:
            self.dropped[STOPPED_IN_FLIGHT] = self.dropped.get(STOPPED_IN_FLIGHT, 0) + running
        if not drained:
            log.warning(
                "shadow runner stopped after %.1f s of draining: %d queued and %d running "
                "jobs dropped (quantdrift_gateway_shadow_dropped_total)",
                timeout,
                queued,
                running,
            )
        await self.upstreams.aclose()

    @property
    def tf_pools(self) -> set[str]:
        """The reference pools of teacher-forced routes."""
        return {rc.reference for rc in self.config.routes.values() if rc.teacher_forced}

    async def _probe_loop(self) -> None:
        """At start, then every ``PROBE_EVERY_S``: each pool's engine identity, and once
        per teacher-forcing pool whether it can do what it declared. A pool that cannot
        is logged once, clearly, and shown as 0 in ``teacher_forcing_ready``; one that
        does not answer yet is tried again."""
        while True:
            for name in self.config.order:
                try:
                    pool = self.upstreams[name]
                    self._identified(name, await pool.identify())
                    if name in self.tf_pools and name not in self.tf_ready:
                        await self._probe_tf(name)
                except Exception:  # a probe must never take the loop down
                    log.exception("probe of pool %s failed", name)
            await asyncio.sleep(PROBE_EVERY_S)

    def _identified(self, name: str, now: EngineInfo) -> None:
        """Keep a pool's identity; a change of engine, version or model under a running
        gateway is logged and counted (``engine_changes``): pairs after it are about
        another candidate. The breaker restarts a route's evidence on the same change
        (``EngineInfo.identity``, one definition), seen in the pairs' scores."""
        before = self.identities.get(name)
        self.identities[name] = now
        current = now.identity()
        if before is not None and current is not None and before.identity() != current:
            self.engine_changes[name] = self.engine_changes.get(name, 0) + 1
            log.warning(
                "pool %s now served by %s %s (%s), was %s %s (%s): pairs from here on are "
                "about another engine or model",
                name,
                now.engine,
                now.version,
                now.model,
                before.engine,
                before.version,
                before.model,
            )

    async def _probe_tf(self, name: str) -> None:
        outcome = await self.upstreams[name].probe_teacher_forcing(timeout_s=10.0)
        mode = self.config.pool(name).teacher_forcing
        if isinstance(outcome, Scored):
            self.tf_ready[name] = 1.0
            log.info("teacher forcing (%s) on pool %s: ready", mode, name)
        elif outcome.reason == UNSUPPORTED:
            self.tf_ready[name] = 0.0
            log.error(
                "teacher forcing (%s) on pool %s is not supported by its server: %s; "
                "teacher-forced routes on it get no tf_kl (set pools.%s.teacher_forcing "
                "to what the server is: vllm or lab)",
                mode,
                name,
                outcome.detail,
                name,
            )

    async def _work(self) -> None:
        while True:
            if not self._queue:
                if not self.in_flight:
                    self._idle.set()
                self._wake.clear()
                await self._wake.wait()
                continue
            job = self._queue.popleft()
            self.in_flight += 1
            try:
                await self._run(job)
            except asyncio.CancelledError:
                raise
            except Exception:  # a bug in pair building must stay here
                log.exception("shadow job failed")
                self._error(job.plan.route, "shadow", "bug")
            finally:
                self.in_flight -= 1
                if not self._queue and not self.in_flight:
                    self._idle.set()

    # -- one job -----------------------------------------------------------------------

    def _candidate_suspended(self, plan: Plan) -> bool:
        """True when the route's current state no longer lets its candidate run."""
        rc = self.config.routes[plan.route]
        now = decide(
            order=self.config.order,
            candidate=rc.candidate,
            reference=rc.reference,
            preference=plan.preference,  # type: ignore[arg-type]
            directive=self._directive_of(plan.route),
            request_id=plan.request_id,
        )
        return now.pair_candidate is None

    async def _run(self, job: ShadowJob) -> None:
        plan = job.plan
        cache: dict[str, Completion] = {} if job.user is None else {job.user.precision: job.user}
        try:
            async with asyncio.timeout(self.config.timeouts.shadow_total_s):
                for kind, wanted in (("shadow", plan.shadow), ("noise", plan.noise)):
                    if wanted:
                        await self._pair(kind, plan, cache)
        except TimeoutError:
            self._drop(DEADLINE)
            self._error(plan.route, "shadow", "deadline")

    async def _pair(self, kind: str, plan: Plan, cache: dict[str, Completion]) -> None:
        try:
            pair = await (
                self._shadow_pair(plan, cache)
                if kind == "shadow"
                else self._noise_pair(plan, cache)
            )
        except UpstreamError as exc:
            self._error(plan.route, kind, f"upstream_{error_reason(exc)}")
            return
        except GatewayOverloaded:
            self._error(plan.route, kind, "overloaded")
            return
        except UpstreamClientError:
            self._error(plan.route, kind, "upstream_rejected")
            return
        if pair is None:
            return
        if self._offer is None:
            self._error(plan.route, kind, "no_publisher")
            return
        self.offered += 1
        self._offer(pair)

    def _body(self, plan: Plan) -> dict[str, Any]:
        body = {k: v for k, v in plan.body.items() if k != "n"}
        body["logprobs"] = True
        body["top_logprobs"] = self.config.top_logprobs
        return body

    async def _collect(self, precision: str, body: Mapping[str, Any]) -> Completion:
        acc = Accumulator(precision, keep_logprobs=self.config.limits.max_logprob_tokens)
        stream = self.upstreams[precision].stream(body, total_s=self.config.timeouts.shadow_total_s)
        async with contextlib.aclosing(stream):
            async for chunk in stream:
                acc.add(chunk)
        return acc.finish().stripped(self.config.top_logprobs)

    async def _shadow_pair(self, plan: Plan, cache: dict[str, Completion]) -> PairEvent | None:
        d = plan.decision
        if d.pair_candidate is None:
            return None
        body = self._body(plan)
        for precision in (d.pair_candidate, d.pair_reference):
            if precision in cache:
                continue
            if precision == d.pair_candidate and self._candidate_suspended(plan):
                self._drop(ROLLED_BACK)
                return None
            cache[precision] = await self._collect(precision, body)
        cand, ref = cache[d.pair_candidate], cache[d.pair_reference]
        tf = None
        if self.config.routes[plan.route].teacher_forced and cand.text:
            tf = await self._teacher_forced(plan, d.pair_reference, cand)
        rate = self.config.shadow_rate(plan.route) * self.mirrored_share
        return self._build(plan, "shadow", cand, ref, tf, rate)

    async def _teacher_forced(
        self, plan: Plan, reference: str, cand: Completion
    ) -> list[float] | None:
        """The reference's log-probs of the candidate's tokens, or None: every None is
        counted (``shadow_errors{reason="tf_..."}``), and logged once per pool and reason."""
        outcome = await self.upstreams[reference].score(
            plan.body.get("messages"), cand, timeout_s=self.config.timeouts.shadow_total_s
        )
        if isinstance(outcome, Scored):
            return outcome.logprobs
        self._error(plan.route, "shadow", f"tf_{outcome.reason}")
        key = (reference, outcome.reason)
        if key not in self._tf_logged:
            self._tf_logged.add(key)
            mode = self.config.pool(reference).teacher_forcing
            log.error(
                "teacher forcing (%s) on reference pool %s failed: %s: %s; pairs go without "
                'tf_kl (counted in quantdrift_gateway_shadow_errors_total{reason="tf_%s"}; '
                "logged once per pool and reason)",
                mode,
                reference,
                outcome.reason,
                outcome.detail,
                outcome.reason,
            )
        return None

    async def _noise_pair(self, plan: Plan, cache: dict[str, Completion]) -> PairEvent:
        ref = plan.decision.pair_reference
        body = self._body(plan)
        if ref not in cache:
            cache[ref] = await self._collect(ref, body)
        # The second run uses the same decoding as the first: a greedy request's noise
        # pair must measure greedy-vs-greedy disagreement (batching nondeterminism on
        # GPU servers), never a sampled run labelled greedy. Where two greedy runs are
        # identical the floor drops the pair and the blessed baseline stands in.
        second = await self._collect(ref, dict(body))
        rate = self.config.noise_rate(plan.route) * self.mirrored_share
        return self._build(plan, "noise", cache[ref], second, None, rate)

    def _build(
        self,
        plan: Plan,
        kind: str,
        cand: Completion,
        ref: Completion,
        tf: list[float] | None,
        rate: float,
    ) -> PairEvent:
        request = request_info(
            plan.body,
            plan.spec,
            clear=self.config.routes[plan.route].clear_prompts,
            private=plan.private,
            preference=plan.preference,
            salt=self._salt,
        )
        k = self.config.top_logprobs
        return PairEvent(
            pair_id=pair_id_for(plan.request_id, kind),
            ts=time.time(),
            route=plan.route,
            kind=kind,  # type: ignore[arg-type]
            candidate=self._side(cand, k),
            reference=self._side(ref, k),
            request=request,
            reference_logprobs_on_candidate=tf,
            sample_rate=max(rate, 1e-9),
            tags=dict(plan.tags),
        )

    def _side(self, c: Completion, k: int) -> ModelOutput:
        """One side of the pair, with what served it (pool identity + the answer's
        ``system_fingerprint``) when anything is known."""
        out = c.output(k)
        known = self.identities.get(c.precision) or EngineInfo()
        info = known.model_copy(update={"system_fingerprint": c.system_fingerprint})
        if info == EngineInfo():
            return out
        return out.model_copy(update={"engine": info})

    # -- metrics -------------------------------------------------------------------------

    def collect(self) -> Iterator[Any]:
        yield counter(
            "shadow_errors",
            "shadow calls or pairs that failed",
            ["route", "kind", "reason"],
            self.errors,
        )
        yield gauge(
            "teacher_forcing_ready",
            "1 when the pool's server teacher-forces as declared, 0 when it cannot",
            ["pool", "mode"],
            {(p, self.config.pool(p).teacher_forcing): v for p, v in self.tf_ready.items()},
        )
        yield counter(
            "engine_changes",
            "times a pool's engine, version or served model changed under the gateway",
            ["pool"],
            {(p,): n for p, n in self.engine_changes.items()},
        )
        yield gauge("shadow_queue_depth", "shadow jobs waiting", [], {(): len(self._queue)})
        yield gauge("shadow_in_flight", "shadow jobs running", [], {(): self.in_flight})
        yield gauge(
            "shadow_queue_capacity", "shadow queue size", [], {(): self.config.shadow_queue}
        )


def request_info(
    body: Mapping[str, Any],
    spec: JsonSpec | None,
    *,
    clear: bool,
    private: bool,
    preference: str | None,
    salt: str,
) -> RequestInfo:
    """What a pair says about its request, under the privacy rule: the prompt itself only
    when the route asks for clear prompts and the request is not private, else its
    salted hash. One function for every producer of pairs (gateway, LiteLLM callback)."""
    prompt = prompt_text(body.get("messages"))
    clear = clear and not private
    return RequestInfo.model_validate(
        {
            "prompt": prompt if clear else None,
            "prompt_hash": None if clear or prompt is None else prompt_hash(prompt, salt),
            "private": private,
            "precision_preference": preference,
            "expects_json": spec is not None,
            "json_schema": spec.schema if spec else None,
            "expected_keys": spec.expected_keys if spec else None,
            "temperature": _num(body.get("temperature"), lambda v: v >= 0),
            "top_p": _num(body.get("top_p"), lambda v: 0 < v <= 1),
            "max_tokens": _int(body.get("max_completion_tokens") or body.get("max_tokens")),
        }
    )


def _num(value: Any, ok: Any) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool) and ok(value):
        return float(value)
    return None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 1 else None
