"""The shadow runner's pure half: whether a job may still call its candidate, what the
calls send, and the pair built from their answers.

No I/O, no clock: the runner (``shadow.py``) makes the calls and passes in what they
returned, the route's directive and preflight cap, the pools' identities and the
time. So every rule about what a pair says is tested as a function.

* **Suspension.** A job waits in the queue; by the time it runs its route may have
  been rolled back, or its preflight cap lowered. :func:`candidate_suspended` asks
  the same :func:`~quantdrift.gateway.chain.planning.route_decision` a request gets, with
  the route's state now, and the job's candidate is not called when it no longer
  pairs one.
* **Privacy.** Prompts leave as the salted hash of ``schemas/privacy.py``
  (HMAC-SHA256 with ``prompt_salt``) unless the route opts in with
  ``clear_prompts``; a request marked private never carries its prompt
  (:func:`request_info`, one function for every producer of pairs: the gateway, the
  LiteLLM callback, the corpus recorder).
* **Sample rate.** A pair's ``sample_rate`` is its share of the route's traffic: the
  route's shadow (or noise) share times ``mirrored_share``, the share of the route's
  traffic that reaches this runner at all (1 in the gateway; in a collector, what the
  gateway in front mirrors to it).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from quantdrift.gateway.chain.planning import Incoming, JsonSpec, Plan, route_decision
from quantdrift.gateway.chain.routing import RouteDirective
from quantdrift.gateway.gateway_config import GatewayConfig, candidate_route
from quantdrift.gateway.guards.auth import OPEN
from quantdrift.gateway.openai_wire import Completion
from quantdrift.gateway.upstream.teacher_forcing import Scored
from quantdrift.schemas.pair import EngineInfo, ModelOutput, PairEvent, RequestInfo, pair_id_for
from quantdrift.schemas.privacy import prompt_hash


def _no_cap(_route: str) -> float | None:
    return None


def candidate_suspended(
    config: GatewayConfig,
    plan: Plan,
    directive_of: Callable[[str], RouteDirective | None],
    cap_of: Callable[[str], float | None] = _no_cap,
) -> bool:
    """True when the route's state now no longer pairs this request with a candidate
    (rolled back, or its share moved off the candidate): the job must not call it."""
    incoming = Incoming(
        headers={},
        principal=OPEN,  # the request was admitted when it was planned
        request_id=plan.request_id,
        directive_of=directive_of,
        cap_of=cap_of,
    )
    decision = route_decision(config, plan.route, plan.preference, incoming, plan.tags)
    return decision.pair_candidate is None


def side_of(config: GatewayConfig, route: str, precision: str) -> str:
    """Which side of ``route`` a pool is, for the spend: ``reference`` or ``candidate``."""
    return "reference" if precision == config.routes[route].reference else "candidate"


def shadow_body(config: GatewayConfig, plan: Plan) -> dict[str, Any]:
    """What a shadow call sends: the plan's body, one choice, the pair's log-probs."""
    body = {k: v for k, v in plan.body.items() if k != "n"}
    body["logprobs"] = True
    body["top_logprobs"] = config.top_logprobs
    return body


def pair_rate(
    config: GatewayConfig, route: str, kind: str, mirrored_share: float, sampled_at: float | None
) -> float:
    """A pair's share of the route's traffic (module docstring); ``sampled_at``: the share
    its request was sampled at (an adaptive share's, ``Plan.shadow_rate``)."""
    if kind == "shadow":
        rate = config.shadow_rate(route) if sampled_at is None else sampled_at
    else:
        rate = config.noise_rate(route)
    return max(rate * mirrored_share, 1e-9)


def side_output(c: Completion, k: int, identities: Mapping[str, EngineInfo]) -> ModelOutput:
    """One side of the pair, with what served it (pool identity + the answer's
    ``system_fingerprint``) when anything is known."""
    out = c.output(k)
    known = identities.get(c.precision) or EngineInfo()
    info = known.model_copy(update={"system_fingerprint": c.system_fingerprint})
    if info == EngineInfo():
        return out
    return out.model_copy(update={"engine": info})


def build_pair(
    config: GatewayConfig,
    plan: Plan,
    kind: str,
    sides: tuple[Completion, Completion],
    tf: Scored | None,
    *,
    rate: float,
    salt: str,
    identities: Mapping[str, EngineInfo],
    ts: float,
    extra: str | None = None,
) -> PairEvent:
    """The pair of ``sides`` (candidate, reference; for noise two reference runs).

    ``tf``: the teacher-forced pass on the candidate's tokens, if any: the reference's
    log-prob of each, and where it reported them its top-k and the candidate's ranks.
    ``extra``: the pair is an extra candidate pool's, judged side by side with the
    route's candidate: it goes under that pool's route id (``candidate_route``) with a
    pair id of its own.
    """
    cand, ref = sides
    route = plan.route if extra is None else candidate_route(plan.route, extra)
    label = kind if extra is None else f"{kind}@{extra}"
    request = request_info(
        plan.body,
        plan.spec,
        clear=config.routes[plan.route].clear_prompts,
        private=plan.private,
        preference=plan.preference,
        salt=salt,
    )
    k = config.top_logprobs
    return PairEvent(
        pair_id=pair_id_for(plan.request_id, label),
        ts=ts,
        route=route,
        kind=kind,  # type: ignore[arg-type]
        candidate=side_output(cand, k, identities),
        reference=side_output(ref, k, identities),
        request=request,
        reference_logprobs_on_candidate=None if tf is None else tf.logprobs,
        reference_top_on_candidate=None if tf is None else tf.top,
        reference_rank_on_candidate=None if tf is None else tf.ranks,
        sample_rate=rate,
        tags=dict(plan.tags),
    )


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
