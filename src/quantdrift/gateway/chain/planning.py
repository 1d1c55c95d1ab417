"""Everything decided about one request before the first upstream call: one pure function.

``plan_request`` reads the body, the headers, the caller's ``Principal`` and
the route's state, and returns a ``Plan`` or a ``Refusal`` (an OpenAI-shaped
4xx). No I/O, no clock, no randomness: the request id and salts come in as
arguments, so every rule here is tested as a table.

* Route: header ``X-Quantdrift-Route``, else body ``route``, else the body's
  ``model`` when it names a route, else ``default_route``.
* Preference: body ``precision_preference`` or header ``X-Precision-Preference``,
  else the default; ``high_precision`` needs a key that grants it (403).
* Body: OpenAI's chat parameters pass, quantdrift's extensions are read and
  removed, ``extra_body_fields`` pass, anything else is refused (or dropped,
  with ``unknown_fields: drop``) -- an allowlist, not a pass-through by default.
* Sampling: the mirror and noise decisions hash the *gateway's* request id
  with a secret salt, so a caller cannot choose which of its requests are
  mirrored; the client's ``X-Request-Id`` is kept only for tracing.
* Privacy: header ``X-Quantdrift-Private: 1`` (or ``true``) marks one request
  private: its pair carries no prompt, not even on a route with clear prompts.
* Slice tags (``slices.py``): language, length, output kind, decoding and the
  caller's task (header ``X-Quantdrift-Task`` or ``metadata.task``, bounded by the
  gateway's ``TaskVocabulary``), computed here once and carried onto every pair.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from quantdrift.gateway.chain.routing import PREFERENCES, Decision, RouteDirective, decide
from quantdrift.gateway.chain.sampling import sampled
from quantdrift.gateway.chain.slices import declared_task, pool_tasks, request_tags
from quantdrift.gateway.gateway_config import GatewayConfig
from quantdrift.gateway.guards.auth import Principal
from quantdrift.gateway.openai_wire import EXTENSION_FIELDS, OPENAI_FIELDS
from quantdrift.schemas.pair import RequestInfo

ROUTE_HEADER = "x-quantdrift-route"
PREFERENCE_HEADER = "x-precision-preference"
PRIVATE_HEADER = "x-quantdrift-private"
CLIENT_ID_HEADER = "x-request-id"
NOISE_SALT = "noise:"
MAX_N = 16


@dataclass(frozen=True, slots=True)
class Refusal:
    """A request the gateway will not run: status and OpenAI's error fields."""

    status: int
    message: str
    param: str | None = None
    code: str = "invalid_value"
    type: str = "invalid_request_error"


def _no_cap(_route: str) -> float | None:
    return None


def _flat(_route: str) -> float | None:
    return None


def _not_filling(_route: str) -> bool:
    return False


def _pool_tasks(raw: str) -> str | None:
    return pool_tasks(raw)


@dataclass(frozen=True, slots=True)
class Incoming:
    """What planning reads of a request besides its body (chat and text completions alike).

    Who asks, the headers (lower-case keys), the gateway's own request id, and the
    gateway's view of each route: its directive (``routing.RouteDirective``), its
    preflight cap, and whether its sampled noise floor is still filling
    (``control/floors.py``: its sampled requests then get ``noise_fill.max_rate``),
    and how a declared task becomes a bounded tag value (``slices.TaskVocabulary.admit``;
    without one every declared task is ``other``). ``share_of``: the route's adaptive
    shadow share now (``control/share.py``), None for the configured flat share.
    """

    headers: Mapping[str, str]
    principal: Principal
    request_id: str
    directive_of: Callable[[str], RouteDirective | None]
    cap_of: Callable[[str], float | None] = _no_cap
    filling: Callable[[str], bool] = _not_filling
    admit_task: Callable[[str], str | None] = _pool_tasks
    share_of: Callable[[str], float | None] = _flat


@dataclass(frozen=True, slots=True)
class JsonSpec:
    """What a request asked for: JSON at all, its schema, its required keys."""

    schema: dict[str, Any] | None = None
    expected_keys: list[str] | None = None
    require_object: bool = False

    def info(self) -> RequestInfo:
        return RequestInfo(
            expects_json=True, json_schema=self.schema, expected_keys=self.expected_keys
        )


@dataclass(frozen=True, slots=True)
class Plan:
    """One request, decided: where it goes, what goes upstream, what the client gets back."""

    request_id: str  # the gateway's own; sampling, pair ids, the x-request-id header
    client_request_id: str | None  # the caller's X-Request-Id: tracing only
    route: str
    preference: str
    decision: Decision
    body: dict[str, Any]  # what goes upstream (before a pool shapes it)
    stream: bool
    include_usage: bool
    n: int
    user_logprobs: bool
    user_top_logprobs: int
    spec: JsonSpec | None
    shadow: bool
    noise: bool
    private: bool
    dropped_fields: tuple[str, ...] = field(default=())
    tags: Mapping[str, str] = field(default_factory=dict)  # the pair's slice (slices.py)
    # The shadow share this request was sampled at (adaptive or flat): its pair's rate.
    shadow_rate: float | None = None

    @property
    def expects_json(self) -> bool:
        """Whether the answer is held to a JSON contract (and so guarded as JSON)."""
        return self.spec is not None


def json_spec(body: Mapping[str, Any]) -> JsonSpec | None:
    """The request's JSON contract, or None when it asked for free text.

    >>> json_spec({"response_format": {"type": "json_object"}}).require_object
    True
    >>> json_spec({"messages": []}) is None
    True
    """
    expected = body.get("expected_keys")
    keys = [k for k in expected if isinstance(k, str)] if isinstance(expected, list) else None
    fmt = body.get("response_format")
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    schema = None
    if kind == "json_schema" and isinstance(fmt, dict):
        wrapper = fmt.get("json_schema")
        if isinstance(wrapper, dict) and isinstance(wrapper.get("schema"), dict):
            schema = wrapper["schema"]
    if kind not in ("json_object", "json_schema") and not keys:
        return None
    return JsonSpec(schema=schema, expected_keys=keys or None, require_object=kind == "json_object")


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def unknown_fields(
    config: GatewayConfig, body: Mapping[str, Any], known: frozenset[str] | set[str]
) -> tuple[list[str], Refusal | None]:
    """Body fields pass through an allowlist (OpenAI's, ours, the config's extras): the
    fields outside it, and the refusal when the config rejects rather than drops them."""
    extra = set(config.extra_body_fields)
    unknown = sorted(k for k in body if k not in known | extra)
    if unknown and config.unknown_fields == "reject":
        return unknown, Refusal(
            400,
            f"Unrecognized request argument supplied: {', '.join(unknown)}",
            unknown[0],
            "unknown_parameter",
        )
    return unknown, None


def choices_asked(body: Mapping[str, Any]) -> int | Refusal:
    """``n`` (default 1), or why it is refused."""
    n = body.get("n", 1)
    if n is None:
        n = 1
    if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= MAX_N:
        return Refusal(400, f"n must be an integer in 1..{MAX_N}", "n")
    return n


_FINITE_FIELDS = ("temperature", "top_p", "frequency_penalty", "presence_penalty")


def decoding_refusal(body: Mapping[str, Any], n: int, max_total_tokens: int) -> Refusal | None:
    """Why the decoding parameters are refused, or None: numbers must be finite numbers, and
    ``n`` times the token cap must stay within ``max_total_tokens``.

    >>> decoding_refusal({"temperature": float("nan")}, 1, 100).param
    'temperature'
    >>> decoding_refusal({"max_tokens": 60}, 2, 100).param
    'max_tokens'
    >>> decoding_refusal({"max_tokens": 50, "top_p": 0.9}, 2, 100) is None
    True
    """
    for name in _FINITE_FIELDS:
        v = body.get(name)
        if v is not None and (
            isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v)
        ):
            return Refusal(400, f"{name} must be a finite number", name)
    for name in ("max_tokens", "max_completion_tokens"):
        v = body.get(name)
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            return Refusal(400, f"{name} must be a positive integer", name)
        if n * v > max_total_tokens:
            return Refusal(
                400, f"n x {name} must be at most {max_total_tokens}, got {n} x {v}", name
            )
    return None


def checked_fields(
    config: GatewayConfig, body: Mapping[str, Any], known: frozenset[str]
) -> tuple[list[str], int] | Refusal:
    """The checks every body passes after its content: the allowlist, ``n``, the decoding.

    The fields outside the allowlist (dropped) and ``n``, or the first refusal.
    """
    unknown, refused = unknown_fields(config, body, known)
    if refused is not None:
        return refused
    n = choices_asked(body)
    if isinstance(n, Refusal):
        return n
    refused = decoding_refusal(body, n, config.limits.max_total_tokens)
    return refused if refused is not None else (unknown, n)


def route_decision(
    config: GatewayConfig,
    route: str,
    preference: str,
    incoming: Incoming,
    tags: Mapping[str, str] | None = None,
) -> Decision:
    """Where the request goes: the route's candidate and reference, its directive, its cap,
    and the slice its ``tags`` put it in."""
    rc = config.routes[route]
    return decide(
        order=config.order,
        candidate=rc.candidate,
        reference=rc.reference,
        preference=preference,  # type: ignore[arg-type]  # checked in route_and_preference
        directive=incoming.directive_of(route),
        request_id=incoming.request_id,
        candidate_cap=incoming.cap_of(route),
        tags=tags,
    )


def plan_tags(body: Mapping[str, Any], incoming: Incoming, *, expects_json: bool) -> dict[str, str]:
    """A request's slice tags, chat and text completions alike: what its pair carries and
    what a held slice matches (``slices.request_tags``, the declared task bounded by the
    gateway's vocabulary)."""
    task = declared_task(incoming.headers, body)
    return request_tags(
        body,
        expects_json=expects_json,
        task=None if task is None else incoming.admit_task(task),
    )


def upstream_body(body: Mapping[str, Any], removed: set[str]) -> dict[str, Any]:
    """What goes upstream: the body without ``removed`` and the stream options (every
    upstream call streams; a pool shapes its own)."""
    drop = removed | {"stream", "stream_options"}
    return {k: v for k, v in body.items() if k not in drop}


def usage_asked(body: Mapping[str, Any]) -> bool:
    """Whether a streamed answer ends with the ``include_usage`` chunk."""
    opts = body.get("stream_options")
    return bool(body.get("stream")) and isinstance(opts, dict) and bool(opts.get("include_usage"))


def route_and_preference(
    config: GatewayConfig, body: Mapping[str, Any], headers: Mapping[str, str], principal: Principal
) -> tuple[str, str] | Refusal:
    """The request's route and precision preference, or why the caller may not have them."""
    cfg = config
    route = headers.get(ROUTE_HEADER) or body.get("route")
    model = body.get("model")
    if route is None and isinstance(model, str) and model in cfg.routes:
        route = model
    route = route or cfg.route_default
    if not isinstance(route, str) or route not in cfg.routes:
        return Refusal(404, f"The model or route {route!r} does not exist", "model",
                       "model_not_found")  # fmt: skip
    if not principal.may_use(route):
        return Refusal(403, f"This key may not use route {route!r}", "model",
                       "route_not_allowed", "permission_error")  # fmt: skip
    preference = (
        body.get("precision_preference") or headers.get(PREFERENCE_HEADER) or cfg.default_preference
    )
    if preference not in PREFERENCES:
        return Refusal(400, f"precision_preference must be one of {', '.join(PREFERENCES)}",
                       "precision_preference")  # fmt: skip
    if preference == "high_precision" and not principal.high_precision:
        return Refusal(403, "This key may not ask for high_precision", "precision_preference",
                       "preference_not_allowed", "permission_error")  # fmt: skip
    return route, str(preference)


def plan_request(
    config: GatewayConfig, body: Mapping[str, Any], incoming: Incoming, *, sample_salt: str
) -> Plan | Refusal:
    """Decide one request (pure; see the module docstring)."""
    cfg = config
    request_id, headers = incoming.request_id, incoming.headers
    chosen = route_and_preference(cfg, body, headers, incoming.principal)
    if isinstance(chosen, Refusal):
        return chosen
    route, preference = chosen
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return Refusal(400, "messages must be a non-empty list", "messages")
    if len(messages) > cfg.limits.max_messages:
        return Refusal(400, f"at most {cfg.limits.max_messages} messages", "messages")
    checked = checked_fields(cfg, body, OPENAI_FIELDS | EXTENSION_FIELDS)
    if isinstance(checked, Refusal):
        return checked
    unknown, n = checked
    top = body.get("top_logprobs")
    if top is not None and (
        not isinstance(top, int) or isinstance(top, bool) or not 0 <= top <= 20
    ):
        return Refusal(400, "top_logprobs must be an integer in 0..20", "top_logprobs")
    upstream = upstream_body(body, {*EXTENSION_FIELDS, *unknown})
    spec = json_spec(body)
    tags = plan_tags(body, incoming, expects_json=spec is not None)
    decision = route_decision(cfg, route, preference, incoming, tags)
    adaptive = incoming.share_of(route)
    rate = cfg.shadow_rate(route) if adaptive is None else adaptive
    shadow = decision.pair_candidate is not None and sampled(request_id, rate, sample_salt)
    # A greedy request never fills a floor faster: two greedy reference runs agree.
    filling = body.get("temperature") != 0 and incoming.filling(route)
    noise = sampled(request_id, cfg.noise_rate(route, filling), NOISE_SALT + sample_salt)
    user_logprobs = bool(body.get("logprobs"))
    user_top = int(top or 0) if user_logprobs else 0
    if user_logprobs or shadow or noise or cfg.logprobs_on_user_calls:
        upstream["logprobs"] = True
        upstream["top_logprobs"] = max(user_top, cfg.top_logprobs)
    return Plan(
        request_id=request_id,
        client_request_id=headers.get(CLIENT_ID_HEADER),
        route=route,
        preference=preference,
        decision=decision,
        body=upstream,
        stream=bool(body.get("stream")),
        include_usage=usage_asked(body),
        n=n,
        user_logprobs=user_logprobs,
        user_top_logprobs=user_top,
        spec=spec,
        shadow=shadow,
        noise=noise,
        private=_truthy(headers.get(PRIVATE_HEADER)),
        dropped_fields=tuple(unknown),
        tags=tags,
        shadow_rate=rate,
    )
