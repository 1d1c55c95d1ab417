"""The gateway's config file: upstream pools by precision, routes, sampling, guards.

```yaml
precisions:                 # fallback order: cheapest first, the reference last
  int4: [http://10.0.0.1:8000, http://10.0.0.2:8000]
  int8: [http://10.0.0.3:8000]
  bf16: [http://10.0.0.4:8000]
default_route: cs-agent/int4
default_preference: cost_optimized   # or high_precision
shadow_sample_rate: 0.05
noise_sample_rate: 0.01
noise_fill: {max_rate: 0.25, floor_pairs: 30}  # while a route's floor fills: at most 25 %
# optional: the shadow share follows the evidence, 1 % (armed, quiet) to 20 % (warming),
# never above 400 reference tokens/s beyond the floor
# adaptive_share: {floor: 0.01, max: 0.2, cap_reference_tps: 400}
routes:
  cs-agent/int4: {candidate: int4, reference: bf16, teacher_forced: true}
  # optional: until preflight.json verifies (go, two signers), at most 5 % on int4
  # billing/int4: {candidate: int4, reference: bf16,
  #                preflight: {report: preflight.json, canary_percent: 5}}
pools:                      # optional, per precision: what its servers can do
  bf16: {logprobs: false, max_connections: 32, teacher_forcing: vllm}  # or lab | none
auth:                       # optional; without it the gateway is open (and says so)
  keys:
    - {name: team-a, sha256: <hex sha256 of the key>, routes: [cs-agent/int4]}
    - {name: ops, sha256: <...>, routes: ["*"], high_precision: true}
  admin_token_sha256: <...> # bearer for /metrics and /health (else they are open)
admin_listen: 127.0.0.1:9464   # optional: /metrics and /health on their own port only
slices:                     # optional: the callers' task tags (X-Quantdrift-Task, metadata.task)
  tasks: [support, billing] # allow-list: any other task is "other"
  max_tasks: 32             # without an allow-list: the first 32 distinct tasks, then "other"
```

Kafka, Redis and signing keys are not here: they come from ``Settings``
(``QUANTDRIFT_*``), like every other command.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from quantdrift.config_env import first_problem, read_yaml_mapping
from quantdrift.errors import ConfigError

_ROUTE = re.compile(r"^[A-Za-z0-9._:/@-]+$")


class DegenerationConfig(BaseModel):
    """Knobs of the probes; ``enabled`` False turns the guard off."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = True
    repetition: bool = True
    tail_chars: int = Field(default=1500, ge=64)
    check_every: int = Field(default=8, ge=1)
    min_chars: int = Field(default=24, ge=0)
    entropy: bool = True
    entropy_floor: float = Field(default=0.05, ge=0)
    entropy_window: int = Field(default=48, ge=4)
    structured_min_copies: int = Field(default=16, ge=3)
    structured_min_tokens: int = Field(default=96, ge=8)
    structural_share: float = Field(default=0.12, gt=0, le=1)


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PreflightGateConfig(_Frozen):
    """Hold a route's candidate to a canary share until its preflight report verifies.

    Off unless a route names it. ``report``: the JSON ``quantdrift preflight``
    wrote (its approvals beside it in ``REPORT.signoff.json``); relative paths are
    read from the config file's folder. Verified means what ``quantdrift preflight
    verify`` means: ``go`` and ``required_signers`` distinct valid approvals under
    the gateway's signing key ring (distinct *keys* with ``distinct_keys``).
    Until then at most ``canary_percent`` of the route's requests reach the
    candidate; the rest get the reference, the candidate mirrored in shadow.
    """

    report: Path
    canary_percent: float = Field(default=0.0, ge=0, le=100)
    required_signers: int = Field(default=2, ge=1)
    distinct_keys: bool = False


class AdaptiveShareConfig(_Frozen):
    """A shadow share that follows the route's evidence, under a cap (``control/share.py``).

    Off unless set (globally or on a route; a route's replaces the global one). The
    share runs from ``floor`` (an armed, quiet route) to ``max`` (a route warming, partly
    armed, half-open, after an engine change, or with a test near its threshold), read
    from the breaker's state every ``refresh_s``. ``cap_reference_tps``: reference
    tokens per second the route's shadowing (shadow, noise and teacher-forced calls) may
    spend above the floor, averaged by a bucket of ``burst_s`` seconds; none: no cap.
    ``calm``: below this progress towards its threshold (log e over log threshold) a
    test asks for no more pairs; ``slice_want``: how much of the range an armed route
    gets while all its judged slices have too few pairs (in proportion when some do).
    """

    floor: float = Field(default=0.01, ge=0, le=1)
    max: float = Field(default=0.2, ge=0, le=1)
    cap_reference_tps: float | None = Field(default=None, gt=0)
    burst_s: float = Field(default=30.0, gt=0)
    slice_want: float = Field(default=0.1, ge=0, le=1)
    calm: float = Field(default=0.5, ge=0, le=1)
    window_s: float = Field(default=60.0, gt=0)
    refresh_s: float = Field(default=2.0, gt=0)

    @model_validator(mode="after")
    def _ordered(self) -> AdaptiveShareConfig:
        if self.floor > self.max:
            raise ValueError(f"adaptive_share: floor {self.floor} is above max {self.max}")
        return self


class RouteConfig(_Frozen):
    """One route: which precision is the candidate, which the reference.

    ``clear_prompts``: pairs of this route carry the prompt itself; by default they
    carry only a salted hash (privacy by default: Kafka is read by more people than
    the gateway's users trusted with their prompts). ``preflight``: optional, see
    :class:`PreflightGateConfig`.
    """

    candidate: str
    reference: str
    teacher_forced: bool = False
    shadow_sample_rate: float | None = Field(default=None, ge=0, le=1)
    noise_sample_rate: float | None = Field(default=None, ge=0, le=1)
    clear_prompts: bool = False
    preflight: PreflightGateConfig | None = None
    # Pools judged side by side with the candidate on the same sampled requests, against
    # the same one reference answer; each publishes its pairs under its own route id
    # (``candidate_route``) and gets its own evidence and verdict. They serve no user.
    extra_candidates: list[str] = Field(default_factory=list, max_length=8)
    # A share that follows the evidence (replaces the gateway-wide ``adaptive_share``).
    adaptive_share: AdaptiveShareConfig | None = None


class SliceConfig(_Frozen):
    """How the gateway bounds the task tag its callers declare (``slices.py``).

    ``tasks``: an allow-list; a declared task outside it is tagged ``other``. Without
    one, the first ``max_tasks`` distinct tasks this gateway sees are kept and every
    later one is ``other``, so a caller cannot flood the breaker with slices.
    """

    tasks: list[str] = Field(default_factory=list, max_length=256)
    max_tasks: int = Field(default=32, ge=1, le=256)

    @model_validator(mode="after")
    def _task_names(self) -> SliceConfig:
        for task in self.tasks:
            if not re.match(r"^[a-z0-9][a-z0-9._-]{0,31}$", task):
                raise ValueError(f"slices.tasks: {task!r} is not a task name ([a-z0-9._-])")
        return self


class NoiseFillConfig(_Frozen):
    """While a route lacks its noise floor, raise its noise share, within a cap.

    A divergence test abstains until the route's floor holds its minimum of noise
    pairs (``breaker/readiness.py``); at a noise share of 1 % that takes thousands of
    requests, during which the route is only partly armed. So the gateway reads each
    route's *sampled* floor from Redis every ``refresh_s`` and, while it holds fewer
    than ``floor_pairs`` noise pairs, samples that route's sampled requests for noise
    at ``max_rate`` (never below the route's own rate). The cost is bounded: about
    ``floor_pairs`` extra reference calls per route, then the share drops back. Greedy
    requests are never raised: two greedy reference runs agree, so a greedy floor comes
    from a blessed baseline (``quantdrift calibrate --blessed-label``). ``max_rate: 0``
    turns it off. Set ``floor_pairs`` to the largest of the policies' ``min_floor_pairs``
    and (with the sequential rule) ``min_noise_pairs``.
    """

    max_rate: float = Field(default=0.25, ge=0, le=1)
    floor_pairs: int = Field(default=30, ge=1)
    refresh_s: float = Field(default=5.0, gt=0)


_SHA256 = r"^[0-9a-f]{64}$"


class PoolConfig(_Frozen):
    """What one precision's servers can do, and how much of them the gateway may use.

    Capabilities are declared, not probed: a server that refuses ``logprobs`` would
    otherwise fail users' requests, and one that ignores ``stream_options`` would
    leave ``usage`` empty.
    """

    logprobs: bool = True
    max_top_logprobs: int = Field(default=20, ge=0, le=20)
    stream_usage: bool = True  # honours stream_options.include_usage (vLLM, OpenAI, lab serve)
    max_connections: int | None = Field(default=None, ge=1)  # default: the global max_connections
    acquire_timeout_s: float = Field(default=0.5, gt=0)
    # What serving from this pool costs, in the team's own unit ($ per million tokens,
    # GPU-hours per day, ...): ``quantdrift shadow report`` ranks a route's candidates by it.
    cost: float | None = Field(default=None, ge=0)
    # How a route's teacher_forced scores are obtained when this pool is its reference:
    # lab = POST /v1/score (quantdrift lab serve), vllm = chat + prompt_logprobs.
    teacher_forcing: Literal["vllm", "lab", "none"] = "lab"
    # The servers report an answer's token ids when asked (vLLM's ``return_token_ids``).
    # A candidate pool that does has its shadowed answers teacher-forced on those very
    # ids, so no re-tokenized text can split differently (it did for about one answer in
    # six cut by max_tokens); the ids never reach users.
    token_ids: bool = False


class ApiKey(_Frozen):
    """One caller: the sha256 of its key (never the key), its routes, its privileges."""

    name: str = Field(min_length=1, max_length=64)
    sha256: str = Field(pattern=_SHA256)
    routes: list[str] = Field(default_factory=lambda: ["*"])
    high_precision: bool = False


class AuthConfig(_Frozen):
    """API keys; ``admin_token_sha256`` guards ``/metrics`` and ``/health`` when set."""

    keys: list[ApiKey] = Field(default_factory=list)
    admin_token_sha256: str | None = Field(default=None, pattern=_SHA256)


class RetryBudgetConfig(_Frozen):
    """Envoy's retry budget: fallbacks at most ``ratio`` of requests (plus a floor)."""

    ratio: float = Field(default=0.2, ge=0, le=1)
    min_per_window: int = Field(default=5, ge=0)
    window_s: float = Field(default=10.0, gt=0)


class OutlierConfig(_Frozen):
    """Eject a server after consecutive failures, for longer each time it recurs."""

    consecutive_failures: int = Field(default=5, ge=1)
    base_ejection_s: float = Field(default=30.0, gt=0)
    max_ejection_s: float = Field(default=300.0, gt=0)


class TimeoutConfig(_Frozen):
    """Per upstream attempt: connect, between two reads, whole attempt."""

    connect_s: float = Field(default=2.0, gt=0)
    read_s: float = Field(default=60.0, gt=0)
    total_s: float = Field(default=300.0, gt=0)
    # The whole fallback chain of one user request, every attempt together.
    chain_s: float = Field(default=300.0, gt=0)
    # One shadow or noise job (both calls and the teacher-forced score).
    shadow_total_s: float = Field(default=30.0, gt=0)


class OverloadConfig(_Frozen):
    """When the gateway counts itself overloaded (``overload.LoopLag``).

    ``max_loop_lag_s``: how late the event loop may run before new requests are shed
    (503 ``overloaded``) and a timeout is counted as the gateway's own, not the
    upstream's. Keep it well under ``timeouts.connect_s``.
    """

    max_loop_lag_s: float = Field(default=0.5, gt=0)
    tick_s: float = Field(default=0.05, gt=0)
    retry_after_s: int = Field(default=1, ge=1)


class JsonGuardConfig(_Frozen):
    max_whitespace_run: int | None = Field(default=64, ge=1)
    max_depth: int = Field(default=64, ge=1)


class RequestLimits(_Frozen):
    """What one request may make the gateway hold or ask for; beyond it, a 4xx, no upstream call.

    ``max_body_bytes``: a larger body gets 413 before it is read whole. ``max_total_tokens``:
    ``n`` times ``max_tokens`` (or ``max_completion_tokens``). ``max_logprob_tokens``: per-token
    log-prob entries kept per choice (choice 0 for the probes always; the others only when
    the caller asked for logprobs); entries past it are not kept.
    """

    max_body_bytes: int = Field(default=8 * 1024 * 1024, ge=1024)
    max_messages: int = Field(default=2048, ge=1)
    max_total_tokens: int = Field(default=262_144, ge=1)
    max_logprob_tokens: int = Field(default=32_768, ge=0)
    # A shadow job keeps the request to re-ask the reference; larger bodies are not mirrored.
    max_shadow_body_bytes: int = Field(default=256 * 1024, ge=1024)


class CollectorConfig(_Frozen):
    """Read by ``quantdrift collector`` only (the gateway ignores it).

    ``mirrored_share``: the share of each route's traffic that the gateway in front
    mirrors to the collector (nginx ``split_clients`` 5 % -> 0.05). The collector samples
    its own ``shadow_sample_rate`` of what arrives, so its pairs carry ``sample_rate =
    mirrored_share x shadow rate``: their share of the route's traffic, as the
    gateway's pairs do.
    """

    # The share of each route's traffic the gateway in front mirrors here (5 % -> 0.05).
    mirrored_share: float = Field(default=1.0, gt=0, le=1)


class GatewayConfig(_Frozen):
    """Everything ``quantdrift gateway`` needs besides Kafka/Redis settings."""

    precisions: dict[str, list[str]]
    # Optional: the ``model`` name each precision's servers expect (vLLM checks it);
    # without it the request's own ``model`` field is passed through.
    precision_models: dict[str, str] = Field(default_factory=dict)
    routes: dict[str, RouteConfig] = Field(default_factory=dict)
    default_route: str | None = None
    default_preference: Literal["cost_optimized", "high_precision"] = "cost_optimized"
    shadow_sample_rate: float = Field(default=0.05, ge=0, le=1)
    noise_sample_rate: float = Field(default=0.0, ge=0, le=1)
    noise_fill: NoiseFillConfig = NoiseFillConfig()
    # Every route's shadow share follows its evidence, under a cap (off when unset).
    adaptive_share: AdaptiveShareConfig | None = None
    slices: SliceConfig = SliceConfig()
    # Secret: mixed into the mirror decision and the prompt hash. Empty = a random
    # salt per process (sampling then differs across gateway replicas).
    sample_salt: str = ""
    prompt_salt: str = ""
    timeouts: TimeoutConfig = TimeoutConfig()
    max_connections: int = Field(default=200, ge=1)
    pools: dict[str, PoolConfig] = Field(default_factory=dict)
    # Shadow traffic: its own HTTP client, connections and bounded drop-oldest queue.
    shadow_concurrency: int = Field(default=8, ge=1)
    shadow_max_connections: int = Field(default=16, ge=1)
    shadow_queue: int = Field(default=256, ge=1)
    # On shutdown: how long queued and running shadow jobs may finish before they are
    # dropped (counted and logged). uvicorn's graceful timeout is this plus a margin.
    shadow_drain_s: float = Field(default=4.0, ge=0)
    retry_budget: RetryBudgetConfig = RetryBudgetConfig()
    outlier: OutlierConfig = OutlierConfig()
    overload: OverloadConfig = OverloadConfig()
    auth: AuthConfig | None = None
    # "host:port": serve /metrics and /health there (and not on the API port).
    admin_listen: str | None = None
    # Body fields beyond OpenAI's chat parameters that may go upstream (vLLM's top_k...).
    extra_body_fields: list[str] = Field(default_factory=list)
    unknown_fields: Literal["reject", "drop"] = "reject"
    json_guard: JsonGuardConfig = JsonGuardConfig()
    limits: RequestLimits = RequestLimits()
    degeneration: DegenerationConfig = DegenerationConfig()
    # Streams that do not ask for JSON: chunks held back before the first byte goes
    # out, so a loop or a failure in the first tokens still falls back silently.
    stream_holdback_tokens: int = Field(default=48, ge=0)
    # Ask upstreams for logprobs on user calls too, for the entropy probe.
    logprobs_on_user_calls: bool = True
    top_logprobs: int = Field(default=5, ge=0, le=20)
    # Fail closed: past this many seconds with neither control source answering (Redis
    # keys, control topic), every route serves its reference until one answers again.
    control_stale_s: float = Field(default=30.0, gt=0)
    # How often gated routes re-read their preflight report and approvals.
    preflight_refresh_s: float = Field(default=30.0, gt=0)
    # Read by ``quantdrift collector`` only: what the mirroring gateway in front sends it.
    collector: CollectorConfig = CollectorConfig()

    @model_validator(mode="after")
    def _consistent(self) -> GatewayConfig:
        if not self.precisions:
            raise ValueError("precisions: at least one precision pool is needed")
        for name, urls in self.precisions.items():
            if not urls:
                raise ValueError(f"precisions.{name}: no upstream URL")
            for url in urls:
                if not url.startswith(("http://", "https://")):
                    raise ValueError(f"precisions.{name}: {url!r} is not an http(s) URL")
        order = list(self.precisions)
        for name, route in self.routes.items():
            if not _ROUTE.match(name):
                raise ValueError(f"routes: {name!r} is not a valid route name")
            for role in ("candidate", "reference"):
                value = getattr(route, role)
                if value not in self.precisions:
                    raise ValueError(f"routes.{name}.{role}: unknown precision {value!r}")
            if order.index(route.candidate) > order.index(route.reference):
                raise ValueError(
                    f"routes.{name}: the candidate must come before the reference in precisions"
                )
        for name, route in self.routes.items():
            extras = route.extra_candidates
            for pool in extras:
                if pool not in self.precisions:
                    raise ValueError(f"routes.{name}.extra_candidates: unknown precision {pool!r}")
                if pool in (route.candidate, route.reference) or extras.count(pool) > 1:
                    raise ValueError(
                        f"routes.{name}.extra_candidates: {pool!r} is already judged on this "
                        "route (the candidate, the reference, or listed twice)"
                    )
        for name in self.pools:
            if name not in self.precisions:
                raise ValueError(f"pools.{name}: unknown precision")
        for name, route in self.routes.items():
            ref = self.pools.get(route.reference)
            if route.teacher_forced and ref is not None and ref.teacher_forcing == "none":
                raise ValueError(
                    f"routes.{name}: teacher_forced, but pools.{route.reference} "
                    "declares teacher_forcing: none"
                )
        for key in self.auth.keys if self.auth else ():
            for r in key.routes:
                if r != "*" and r not in self.routes:
                    raise ValueError(f"auth.keys.{key.name}: unknown route {r!r}")
        if self.auth and self.auth.keys and not (self.auth.admin_token_sha256 or self.admin_listen):
            # API keys say callers are not trusted: /health and /metrics must not be open.
            raise ValueError(
                "auth.keys is set: set auth.admin_token_sha256 too, or admin_listen "
                "(/health and /metrics on their own, private port)"
            )
        if self.admin_listen is not None and not re.match(r"^[^:\s]+:\d{1,5}$", self.admin_listen):
            raise ValueError(f"admin_listen {self.admin_listen!r} is not host:port")
        if self.default_route is not None and self.default_route not in self.routes:
            raise ValueError(f"default_route {self.default_route!r} is not in routes")
        if not self.routes:
            raise ValueError("routes: at least one route is needed")
        return self

    @property
    def order(self) -> list[str]:
        return list(self.precisions)

    @property
    def route_default(self) -> str:
        return self.default_route or next(iter(self.routes))

    def pool(self, precision: str) -> PoolConfig:
        """The pool's capabilities and limits (defaults when it has no ``pools`` entry)."""
        return self.pools.get(precision) or PoolConfig()

    def pool_connections(self, precision: str) -> int:
        return self.pool(precision).max_connections or self.max_connections

    def shadow_rate(self, route: str) -> float:
        r = self.routes[route].shadow_sample_rate
        return self.shadow_sample_rate if r is None else r

    def adaptive(self, route: str) -> AdaptiveShareConfig | None:
        """The route's adaptive share, if it has one (its own, else the gateway's)."""
        return self.routes[route].adaptive_share or self.adaptive_share

    def noise_rate(self, route: str, filling: bool = False) -> float:
        """The route's noise share; ``filling``: its floor is short (``NoiseFillConfig``)."""
        r = self.routes[route].noise_sample_rate
        rate = self.noise_sample_rate if r is None else r
        return max(rate, self.noise_fill.max_rate) if filling else rate


def candidate_route(route: str, pool: str) -> str:
    """The route id an extra candidate's pairs, evidence and verdict go under.

    >>> candidate_route("cs-agent/int4", "int8")
    'cs-agent/int4@int8'
    """
    return f"{route}@{pool}"


def parse_config(data: dict[str, Any]) -> GatewayConfig:
    try:
        return GatewayConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(first_problem(exc, "gateway config")) from exc


def load_config(path: Path | str) -> GatewayConfig:
    """Read and validate a YAML gateway config; ConfigError says which field is wrong."""
    data = read_yaml_mapping(Path(path), "gateway config")
    return _reports_beside(parse_config(data), Path(path).resolve().parent)


def _reports_beside(config: GatewayConfig, folder: Path) -> GatewayConfig:
    """Relative preflight report paths read from the config file's folder."""
    routes = {}
    for name, rc in config.routes.items():
        gate = rc.preflight
        if gate is not None and not gate.report.is_absolute():
            anchored = gate.model_copy(update={"report": folder / gate.report})
            rc = rc.model_copy(update={"preflight": anchored})
        routes[name] = rc
    return config.model_copy(update={"routes": routes})
