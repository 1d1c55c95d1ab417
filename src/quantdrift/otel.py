"""OpenTelemetry: evaluation events from the worker, GenAI spans from the gateway. Off by default.

Turned on the OpenTelemetry way, by the environment the SDK itself reads:
``OTEL_EXPORTER_OTLP_ENDPOINT`` (or the per-signal ``..._LOGS_ENDPOINT`` /
``..._TRACES_ENDPOINT``), with ``OTEL_EXPORTER_OTLP_HEADERS``,
``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES`` as usual, and
``OTEL_SDK_DISABLED=true`` to keep it off. Export is OTLP over HTTP/protobuf
(``pip install 'quantdrift[otel]'``). One quantdrift knob:
``QUANTDRIFT_OTEL__EVALUATION_SAMPLE`` (0..1, default 1), the share of scored
pairs that become events, chosen by a hash of the pair id, so every worker and
every redelivery makes the same choice.

What is emitted (GenAI semantic conventions where they name a thing):

* worker, per judged shadow pair (not redeliveries: the judge's dedupe decides):
  event ``gen_ai.evaluation.result`` with ``gen_ai.evaluation.name``
  (``quantdrift.shadow_pair``), ``gen_ai.evaluation.score.value`` (the pair's
  similarity, cosine else ROUGE-L), ``gen_ai.evaluation.score.label`` (the
  per-pair verdict: ok / drift / anomaly), ``gen_ai.evaluation.explanation``
  (its reasons), ``quantdrift.pair_id`` / ``quantdrift.route``, and the route's
  readiness as the judge left it after the pair (``breaker/readiness.py``):
  ``quantdrift.route.armed`` (closed, unlocked, every relied-on test can fire) and
  ``quantdrift.route.missing`` (each relied-on test that cannot, with why);
* worker, once per candidate whose relied-on tests still abstain after the policy's
  ``unarmed_alert_pairs``: event ``quantdrift.breaker.not_armed`` (body: the alert);
* worker, per breaker transition: event ``quantdrift.breaker.transition``
  (route, from and to state, rule, epoch, action, target; body: the alert summary);
* gateway, per served user call: a ``chat {model}`` span (kind CLIENT) with
  ``gen_ai.operation.name``, ``gen_ai.request.model``, ``gen_ai.response.model``,
  ``gen_ai.response.id`` (where the upstream gave one), token usage, finish
  reasons, and ``quantdrift.pair_id`` when the call was mirrored, so a backend
  joins a user's call to the evaluation of its pair.

* ``quantdrift preflight certificate-events CERT``, once per call, for a certificate
  that verifies (one that does not is refused, not exported): event
  ``gen_ai.evaluation.result`` named ``quantdrift.certificate`` (label ``verified``,
  the issuer's key id, signers, the build's name and weight hashes, the engine
  it was measured on), and one named ``quantdrift.certificate.slice`` per row of
  its live evidence (``schemas.certificate.live_rows``: route, slice, pairs
  judged as the score, its status as the label, the largest e-value).

The worker does not know the upstream's response id (pairs do not carry it),
so evaluation events carry ``quantdrift.pair_id`` and the gateway's span holds
both: that attribute is the join.

The hooks (:func:`judged`, :func:`transitioned`, :func:`served`) are one line
each in the worker and the gateway; they do nothing when telemetry is off and
never raise into the caller: a broken exporter must not slow or fail a user's
call or a judge's batch (the SDK's batch processors export off the hot path).

A leaf below the gateway, the worker and the services: it imports only the error
tree and the wire formats, and names what it reads of the breaker's and the
gateway's objects as protocols (``RouteStateView``, ``OutboxView``, ...), so the
callers hand in what they already hold and no arrow points back up.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from quantdrift.errors import ConfigError
from quantdrift.schemas.alert import AlertEvent
from quantdrift.schemas.certificate import engine_identity, live_rows
from quantdrift.schemas.certificate_live import live_routes
from quantdrift.schemas.command import RouteCommand
from quantdrift.schemas.pair import pair_id_for
from quantdrift.schemas.score import ScoreEvent


# -- what the hooks read of the breaker's and the gateway's objects -------------------------
class _Readiness(Protocol):
    @property
    def armed(self) -> bool: ...
    @property
    def missing(self) -> Sequence[str]: ...


class RouteStateView(Protocol):
    """A route's state after a fold (``breaker.state.RouteState``)."""

    @property
    def state(self) -> str: ...
    @property
    def locked(self) -> bool: ...
    @property
    def readiness(self) -> _Readiness: ...


class OutboxView(Protocol):
    """One transition's messages (``breaker.outbox.Outbox``)."""

    @property
    def command(self) -> RouteCommand: ...
    @property
    def alert(self) -> AlertEvent: ...


class FoldResultView(Protocol):
    """The judge's answer for one score (``breaker.protocol.FoldResult``)."""

    @property
    def status(self) -> str: ...
    @property
    def state(self) -> RouteStateView | None: ...
    @property
    def not_armed(self) -> AlertEvent | None: ...
    @property
    def outboxes(self) -> Sequence[OutboxView]: ...


class PlanView(Protocol):
    """A served request's plan (``gateway.chain.planning.Plan``)."""

    @property
    def request_id(self) -> str: ...
    @property
    def route(self) -> str: ...
    @property
    def body(self) -> Mapping[str, Any]: ...
    @property
    def shadow(self) -> Any: ...


class TraceView(Protocol):
    """What happened to it (``gateway.chain.attempts.Trace``)."""

    @property
    def t0(self) -> float: ...
    @property
    def fallbacks(self) -> Sequence[str]: ...


class _Choice(Protocol):
    @property
    def finish_reason(self) -> str | None: ...


class CompletionView(Protocol):
    """The answer it got (``gateway.openai_wire.Completion``)."""

    @property
    def precision(self) -> str: ...
    @property
    def model(self) -> str: ...
    @property
    def id(self) -> str: ...
    @property
    def choices(self) -> Sequence[_Choice]: ...
    @property
    def usage(self) -> Mapping[str, Any] | None: ...


log = logging.getLogger(__name__)

EVALUATION_EVENT = "gen_ai.evaluation.result"
TRANSITION_EVENT = "quantdrift.breaker.transition"
NOT_ARMED_EVENT = "quantdrift.breaker.not_armed"
EVALUATION_NAME = "quantdrift.shadow_pair"
CERTIFICATE_NAME = "quantdrift.certificate"
CERTIFICATE_SLICE_NAME = "quantdrift.certificate.slice"
SAMPLE_ENV = "QUANTDRIFT_OTEL__EVALUATION_SAMPLE"
ENDPOINT_ENVS = (
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_LOGS_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
)
SCOPE = "quantdrift"


def sampled(pair_id: str, rate: float) -> bool:
    """Whether a pair's event is emitted: the same answer in every process.

    >>> sampled("p1", 1.0), sampled("p1", 0.0)
    (True, False)
    >>> sum(sampled(f"p{i}", 0.25) for i in range(4000)) in range(900, 1100)
    True
    """
    if rate >= 1.0:
        return True
    if rate <= 0.0:
        return False
    digest = hashlib.blake2b(pair_id.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64 < rate


def evaluation_attributes(score: ScoreEvent, state: RouteStateView | None = None) -> dict[str, Any]:
    """The ``gen_ai.evaluation.result`` attributes for one scored pair (pure); with the
    route's state after the pair, whether the route is armed and what it misses.

    >>> from quantdrift.schemas import Metrics, ScoreEvent
    >>> s = ScoreEvent(pair_id="p", route="r/int4", kind="shadow", ts=0.0,
    ...                metrics=Metrics(cosine=0.5), verdict="drift",
    ...                reasons=["cosine 0.500 < 0.88"])
    >>> a = evaluation_attributes(s)
    >>> a["gen_ai.evaluation.score.value"], a["gen_ai.evaluation.score.label"]
    (0.5, 'drift')
    >>> a["gen_ai.evaluation.explanation"]
    'cosine 0.500 < 0.88'
    """
    m = score.metrics
    similarity = m.cosine if m.cosine is not None else m.rougeL
    attrs: dict[str, Any] = {
        "gen_ai.evaluation.name": EVALUATION_NAME,
        "gen_ai.evaluation.score.label": score.verdict,
        "gen_ai.evaluation.explanation": "; ".join(score.reasons)
        or "the candidate's answer is within the route's tolerance of the reference's",
        "quantdrift.pair_id": score.pair_id,
        "quantdrift.route": score.route,
        "quantdrift.decoding": score.decoding,
    }
    if similarity is not None:
        attrs["gen_ai.evaluation.score.value"] = float(similarity)
    if score.candidate_precision:
        attrs["quantdrift.candidate_precision"] = score.candidate_precision
    if state is not None:
        ready = state.readiness
        attrs["quantdrift.route.armed"] = bool(
            ready.armed and state.state == "closed" and not state.locked
        )
        attrs["quantdrift.route.missing"] = list(ready.missing)
    return attrs


def certificate_attributes(
    payload: Mapping[str, Any], key_id: str, signers: Sequence[str], sha256: str
) -> list[dict[str, Any]]:
    """The ``gen_ai.evaluation.result`` attributes of a *verified* certificate (pure):
    the certificate itself, then one per route and slice of its live evidence.

    >>> rows = certificate_attributes({"route": "r", "model": {"name": "m", "files":
    ...     {"w": "ab"}}, "live": {"text": '{"routes": {"r": {"shadow_pairs": 4}}}'}},
    ...     "ed25519:k", ["alice"], "f00")
    >>> [(a["gen_ai.evaluation.name"], a["gen_ai.evaluation.score.label"]) for a in rows]
    [('quantdrift.certificate', 'verified'), ('quantdrift.certificate.slice', 'no trip')]
    >>> rows[0]["quantdrift.model.files"], rows[1]["gen_ai.evaluation.score.value"]
    (['w=ab'], 4.0)
    """
    model = payload.get("model") or {}
    pf = payload.get("preflight") or {}
    common = {
        "quantdrift.route": str(payload.get("route") or ""),
        "quantdrift.certificate.sha256": sha256,
        "quantdrift.certificate.key_id": key_id,
    }
    head: dict[str, Any] = {
        "gen_ai.evaluation.name": CERTIFICATE_NAME,
        "gen_ai.evaluation.score.label": "verified",
        "gen_ai.evaluation.explanation": (
            f"verified: signed by {key_id}; preflight {pf.get('verdict')} approved by "
            f"{', '.join(signers) or 'nobody'}"
        ),
        **common,
        "quantdrift.certificate.signers": list(signers),
        "quantdrift.model.name": str(model.get("name") or ""),
        "quantdrift.model.files": [
            f"{k}={v}" for k, v in sorted((model.get("files") or {}).items())
        ],
        "quantdrift.certificate.issued_at": float(payload.get("issued_at") or 0.0),
    }
    engine = engine_identity((payload.get("engine") or {}).get("candidate"))
    if engine:
        head["quantdrift.candidate_engine"] = engine
    rows = [head]
    text = (payload.get("live") or {}).get("text")
    bound = {r["route"]: r for r in live_routes(text if isinstance(text, str) else None)}
    for r in live_rows(text):
        attrs = {
            "gen_ai.evaluation.name": CERTIFICATE_SLICE_NAME,
            "gen_ai.evaluation.score.value": float(r["pairs"]),
            "gen_ai.evaluation.score.label": r["status"],
            "gen_ai.evaluation.explanation": r["detail"] or r["status"],
            **common,
            "quantdrift.route": r["route"],
            "quantdrift.slice": r["slice"],
        }
        if r["e_value"] is not None:
            attrs["quantdrift.e_value"] = float(r["e_value"])
        if r["slice"] == "all" and r["route"] in bound:
            attrs.update(_bound_attributes(bound[r["route"]]))
        rows.append(attrs)
    return rows


def _bound_attributes(route: Mapping[str, Any]) -> dict[str, Any]:
    """A route's time window, calibration (per decoding mode's floor) and worst pairs by
    hash, on its ``all`` row: ``quantdrift.evidence.first_pair_at`` / ``last_pair_at``,
    ``quantdrift.calibration.MODE.sha256`` / ``.noise_pairs`` / ``.blessed_pairs``,
    ``quantdrift.worst_pairs.sha256``. The certificate was verified, so the fields hold."""
    attrs: dict[str, Any] = {}
    window = route.get("window")
    if isinstance(window, Mapping):
        attrs["quantdrift.evidence.first_pair_at"] = float(window["first_pair_at"])
        attrs["quantdrift.evidence.last_pair_at"] = float(window["last_pair_at"])
    for c in route.get("calibration") or []:
        mode = f"quantdrift.calibration.{c.get('mode')}"
        attrs[f"{mode}.sha256"] = str(c.get("sha256"))
        attrs[f"{mode}.noise_pairs"] = int(c.get("noise_pairs") or 0)
        attrs[f"{mode}.blessed_pairs"] = int(c.get("blessed_pairs") or 0)
    if worst := [str(p.get("pair_sha256")) for p in route.get("worst_pairs") or []]:
        attrs["quantdrift.worst_pairs.sha256"] = worst
    return attrs


def transition_attributes(outbox: OutboxView) -> dict[str, Any]:
    """The ``quantdrift.breaker.transition`` attributes for one transition (pure)."""
    command, alert = outbox.command, outbox.alert
    return {
        "quantdrift.route": command.route,
        "quantdrift.breaker.to_state": command.state,
        "quantdrift.breaker.kind": alert.kind,
        "quantdrift.breaker.rule": str(alert.evidence.get("rule", "")),
        "quantdrift.breaker.epoch": command.epoch,
        "quantdrift.breaker.action": command.action,
        "quantdrift.breaker.target": command.target,
        "quantdrift.breaker.reason": command.reason,
        "quantdrift.breaker.locked": command.locked,
        "quantdrift.alert.severity": alert.severity,
    }


@dataclass
class Telemetry:
    """A logger for events and a tracer for spans, with the providers to flush them."""

    logger: Any
    tracer: Any
    sample: float = 1.0
    providers: list[Any] = field(default_factory=list)

    def evaluation(self, score: ScoreEvent, state: RouteStateView | None = None) -> None:
        if score.kind != "shadow" or not sampled(score.pair_id, self.sample):
            return
        attrs = evaluation_attributes(score, state)
        self.logger.emit(event_name=EVALUATION_EVENT, attributes=attrs)

    def not_armed(self, alert: AlertEvent) -> None:
        attrs = {
            "quantdrift.route": alert.route,
            "quantdrift.route.armed": False,
            "quantdrift.route.missing": [str(m) for m in alert.evidence.get("missing", [])],
            "quantdrift.alert.severity": alert.severity,
        }
        self.logger.emit(event_name=NOT_ARMED_EVENT, attributes=attrs, body=alert.summary)

    def certificate(self, rows: Sequence[Mapping[str, Any]]) -> None:
        for attrs in rows:
            self.logger.emit(event_name=EVALUATION_EVENT, attributes=dict(attrs))

    def transition(self, outbox: OutboxView) -> None:
        self.logger.emit(
            event_name=TRANSITION_EVENT,
            attributes=transition_attributes(outbox),
            body=outbox.alert.summary,
        )

    def call(self, plan: PlanView, trace: TraceView, completion: CompletionView) -> None:
        # Deferred: opentelemetry is optional; loaded only when export is on.
        from opentelemetry.trace import SpanKind

        model = str(plan.body.get("model") or completion.model or "")
        now_ns = time.time_ns()
        start_ns = now_ns - int(max(0.0, time.monotonic() - trace.t0) * 1e9)
        attrs: dict[str, Any] = {
            "gen_ai.operation.name": "chat",
            "gen_ai.request.model": model,
            "gen_ai.response.model": completion.model,
            "quantdrift.route": plan.route,
            "quantdrift.precision": completion.precision,
            "quantdrift.request_id": plan.request_id,
        }
        if completion.id:
            attrs["gen_ai.response.id"] = completion.id
        finishes = [c.finish_reason for c in completion.choices if c.finish_reason]
        if finishes:
            attrs["gen_ai.response.finish_reasons"] = finishes
        usage = completion.usage or {}
        for ours, theirs in (
            ("gen_ai.usage.input_tokens", "prompt_tokens"),
            ("gen_ai.usage.output_tokens", "completion_tokens"),
        ):
            if isinstance(usage.get(theirs), int):
                attrs[ours] = usage[theirs]
        if plan.shadow:
            attrs["quantdrift.pair_id"] = pair_id_for(plan.request_id, "shadow")
        if trace.fallbacks:
            attrs["quantdrift.fallbacks"] = list(trace.fallbacks)
        span = self.tracer.start_span(
            f"chat {model}".strip(), kind=SpanKind.CLIENT, attributes=attrs, start_time=start_ns
        )
        span.end(end_time=now_ns)

    def flush(self, timeout_ms: int = 5000) -> None:
        for provider in self.providers:
            provider.force_flush(timeout_ms)

    def shutdown(self) -> None:
        for provider in self.providers:
            provider.shutdown()


def build(
    log_exporter: Any | None,
    span_exporter: Any | None,
    sample: float = 1.0,
    resource_attributes: Mapping[str, str] | None = None,
    batch: bool = True,
) -> Telemetry:
    """A Telemetry over the SDK with the given exporters (None: that signal is dropped).

    ``batch=False`` exports synchronously (tests with the in-memory exporters);
    production batches, so exporting never happens on a caller's path.
    """
    # Deferred: opentelemetry is optional; loaded only when export is on.
    from opentelemetry.sdk._logs import LoggerProvider
    from opentelemetry.sdk._logs.export import BatchLogRecordProcessor, SimpleLogRecordProcessor
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

    from quantdrift import __version__

    resource = Resource.create(dict(resource_attributes or {}))
    logs = LoggerProvider(resource=resource)
    spans = TracerProvider(resource=resource)
    if log_exporter is not None:
        logs.add_log_record_processor(
            BatchLogRecordProcessor(log_exporter)
            if batch
            else SimpleLogRecordProcessor(log_exporter)
        )
    if span_exporter is not None:
        spans.add_span_processor(
            BatchSpanProcessor(span_exporter) if batch else SimpleSpanProcessor(span_exporter)
        )
    return Telemetry(
        logger=logs.get_logger(SCOPE, __version__),
        tracer=spans.get_tracer(SCOPE, __version__),
        sample=sample,
        providers=[logs, spans],
    )


def enabled_by(env: Mapping[str, str]) -> bool:
    """On when an OTLP endpoint is set and the SDK is not disabled.

    >>> enabled_by({}), enabled_by({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"})
    (False, True)
    >>> enabled_by({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_SDK_DISABLED": "true"})
    False
    """
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    return any(env.get(name, "").strip() for name in ENDPOINT_ENVS)


def sample_rate(env: Mapping[str, str]) -> float:
    raw = env.get(SAMPLE_ENV, "").strip()
    if not raw:
        return 1.0
    try:
        rate = float(raw)
    except ValueError:
        rate = -1.0
    if not 0.0 <= rate <= 1.0:
        raise ConfigError(f"{SAMPLE_ENV}={raw!r}: a share between 0 and 1 is needed")
    return rate


def from_env(env: Mapping[str, str]) -> Telemetry | None:
    """Telemetry configured by the OTel environment variables, or None when off.

    The OTLP/HTTP exporters read their endpoint, headers, timeout and TLS settings
    from the same variables; the SDK's Resource reads OTEL_SERVICE_NAME and
    OTEL_RESOURCE_ATTRIBUTES. An endpoint set without the ``otel`` extra installed
    is a configuration error, said once, not silence.
    """
    if not enabled_by(env):
        return None
    rate = sample_rate(env)
    try:
        # Deferred: opentelemetry is optional; loaded only when export is on.
        from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    except ImportError as exc:
        raise ConfigError(
            "OTEL_EXPORTER_OTLP_ENDPOINT is set but the OTLP exporter is not installed: "
            "pip install 'quantdrift[otel]'"
        ) from exc
    attrs = {}
    if not env.get("OTEL_SERVICE_NAME") and "service.name" not in env.get(
        "OTEL_RESOURCE_ATTRIBUTES", ""
    ):
        attrs["service.name"] = "quantdrift"
    return build(OTLPLogExporter(), OTLPSpanExporter(), rate, attrs)


# -- the process's telemetry: resolved once, from the environment, on first use -----------
_current: dict[str, Telemetry | None] = {}


def current() -> Telemetry | None:
    """The process's telemetry (None: off). The environment is read once, here, because
    the OpenTelemetry convention is that a process is configured by its environment."""
    if "t" not in _current:
        try:
            _current["t"] = from_env(os.environ)
        except Exception:
            log.exception("OpenTelemetry: could not configure from the environment; off")
            _current["t"] = None
        if _current["t"] is not None:
            log.warning("OpenTelemetry: exporting evaluation events and GenAI spans over OTLP")
    return _current["t"]


def install(telemetry: Telemetry | None) -> None:
    """Use ``telemetry`` from now on (tests, or a host that configures its own SDK)."""
    _current["t"] = telemetry


def reset() -> None:
    """Forget the current telemetry; the next hook reads the environment again."""
    _current.clear()


# -- hooks: one line each in the worker and the gateway; never raise -----------------------
def judged(scores: Sequence[ScoreEvent], results: Sequence[FoldResultView]) -> None:
    """After the judge folded a batch: one event per newly judged pair, one per transition."""
    t = current()
    if t is None:
        return
    try:
        for score, result in zip(scores, results, strict=True):
            if result.status != "dup":
                t.evaluation(score, result.state)
            if result.not_armed is not None:
                t.not_armed(result.not_armed)
            for outbox in result.outboxes:  # a cool-down tick may ride on a duplicate
                t.transition(outbox)
    except Exception:
        log.exception("OpenTelemetry: could not emit evaluation events")


def transitioned(outbox: OutboxView | None) -> None:
    """A transition made outside a fold (the cool-down clock)."""
    t = current()
    if t is None or outbox is None:
        return
    try:
        t.transition(outbox)
    except Exception:
        log.exception("OpenTelemetry: could not emit a transition event")


def served(plan: PlanView, trace: TraceView, completion: CompletionView) -> None:
    """The gateway answered a user: one GenAI span for the call."""
    t = current()
    if t is None:
        return
    try:
        t.call(plan, trace, completion)
    except Exception:
        log.exception("OpenTelemetry: could not record a span")
