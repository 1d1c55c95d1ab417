"""The guard inside a LiteLLM proxy: pairs from ``silent_model`` mirrors, rollbacks obeyed.

Configured the LiteLLM way, in the proxy's ``config.yaml``::

    model_list:
      - model_name: cs-agent                  # what users call: the quantized candidate
        litellm_params: {model: openai/llama-int4, api_base: ..., silent_model: cs-agent-bf16}
      - model_name: cs-agent-bf16             # the BF16 reference
        litellm_params: {model: openai/llama-bf16, api_base: ...}
    litellm_settings:
      callbacks: quantdrift.integrations.litellm.guard

and a small file naming the routes (``QUANTDRIFT_LITELLM__CONFIG``)::

    routes:
      cs-agent/int4: {candidate: cs-agent, reference: cs-agent-bf16}

Broker, Redis, signing keys and the prompt salt come from the usual
``QUANTDRIFT_*`` settings.

What it does:

* **pre-call hook** (``async_pre_call_hook``): writes a join id into the
  request's metadata (and the caller's task, header ``X-Quantdrift-Task`` or
  ``metadata.task``, bounded by the config's ``tasks`` allow-list or its first
  ``max_tasks`` values: the pair's ``task`` tag), and, while the route's latest
  signed RouteCommand puts users on the reference, rewrites ``model`` to the
  reference group; a call of a slice held apart by a slice-scoped rollback goes to
  the reference too, the rest stays on the candidate (``litellm_routing.py``).
  Commands are followed by the gateway's own :class:`RouteController` (control
  topic, with the route's Redis key as backstop; same signature, epoch and freshness
  gate), started in the background on the first call.
* **success logger** (``async_log_success_event``): hands each logged call to
  :class:`PairJoiner`, which pairs the user's call with its mirror by that join
  id and yields a PairEvent (salted prompt hash unless the route sets
  ``clear_prompts``; logprobs where the deployments returned them), offered to
  the gateway's bounded :class:`ShadowPublisher`.
* mirrors that never arrive are counted (``stats.mirrors_missing``) and logged.

Never slows or fails the user's call: no hook awaits the broker or Redis (the
controller and the producer start in the background, the producer's queue is
bounded and drops, counted, when full), and every error is logged and
swallowed. Until the controller has read the route's key the route serves its
candidate, as a gateway does before its first command.

Streams: LiteLLM logs a streamed call once, assembled, so pairs come from
streamed calls too (its mirror is always non-streamed). The gateway's JSON
contract check and precision fallback are not reproduced here: LiteLLM's own
``fallbacks`` cover failed calls, and a malformed JSON answer is scored (and
trips the route) rather than repaired.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from litellm.integrations.custom_logger import CustomLogger

from quantdrift.config import Settings
from quantdrift.errors import ConfigError
from quantdrift.gateway.chain.slices import (
    DIMENSIONS,
    MAX_TASKS,
    OTHER,
    TaskVocabulary,
    declared_task,
    task_value,
)
from quantdrift.integrations.litellm_pairs import (
    REQUEST_FIELDS,
    PairJoiner,
    RouteMap,
    Side,
    output_of,
)
from quantdrift.integrations.litellm_routing import call_tags, serves_reference

log = logging.getLogger("quantdrift.litellm")

CONFIG_ENV = "QUANTDRIFT_LITELLM__CONFIG"
JOIN_KEY = "quantdrift_join_id"
EXPECT_KEY = "quantdrift_expects_mirror"
TASK_KEY = "quantdrift_task"


@dataclass(frozen=True, slots=True)
class GuardConfig:
    routes: tuple[RouteMap, ...]
    mirror_timeout_s: float = 60.0
    top_logprobs: int = 5
    prompt_salt: str = ""
    tasks: tuple[str, ...] = ()
    max_tasks: int = MAX_TASKS

    @classmethod
    def load(cls, path: Path) -> GuardConfig:
        try:
            data = yaml.safe_load(path.read_text()) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError(f"{CONFIG_ENV}={path}: {exc}") from exc
        routes = []
        for name, spec in (data.get("routes") or {}).items():
            if not isinstance(spec, dict) or not spec.get("candidate") or not spec.get("reference"):
                raise ConfigError(f"{path}: route {name!r} needs candidate and reference groups")
            routes.append(
                RouteMap(
                    route=str(name),
                    candidate_group=str(spec["candidate"]),
                    reference_group=str(spec["reference"]),
                    candidate_precision=str(spec.get("candidate_precision", "")),
                    reference_precision=str(spec.get("reference_precision", "")),
                    clear_prompts=bool(spec.get("clear_prompts", False)),
                )
            )
        if not routes:
            raise ConfigError(f"{path}: no routes")
        tasks = data.get("tasks") or []
        if not isinstance(tasks, list) or any(task_value(t) in (None, OTHER) for t in tasks):
            raise ConfigError(f"{path}: tasks must be a list of task names ([a-z0-9._-])")
        return cls(
            tuple(routes),
            float(data.get("mirror_timeout_s", 60.0)),
            int(data.get("top_logprobs", 5)),
            str(data.get("prompt_salt", "")),
            tuple(str(task_value(t)) for t in tasks),
            int(data.get("max_tasks", MAX_TASKS)),
        )


class QuantdriftGuard(CustomLogger):  # type: ignore[misc]
    """LiteLLM callback: one instance per proxy process (``guard`` below)."""

    def __init__(self, config: GuardConfig | None = None, settings: Settings | None = None):
        super().__init__()
        self._config = config
        self._settings = settings
        self._joiner: PairJoiner | None = None
        self._groups: dict[str, RouteMap] = {}
        self._controller: Any = None
        self._publisher: Any = None
        self._started: asyncio.Task[None] | None = None
        self._expiry: asyncio.Task[None] | None = None
        self._tasks: TaskVocabulary | None = None

    # -- setup (lazy: LiteLLM imports the module before its event loop runs) -------------
    def _ensure(self) -> PairJoiner:
        if self._joiner is None:
            if self._config is None:
                path = os.environ.get(CONFIG_ENV)
                if not path:
                    raise ConfigError(f"set {CONFIG_ENV} to the quantdrift routes file")
                self._config = GuardConfig.load(Path(path))
            if self._settings is None:
                self._settings = Settings()
            salt = self._config.prompt_salt or os.environ.get("QUANTDRIFT_PROMPT_SALT", "")
            if not salt:
                # A process-local secret: hashes join within this proxy's lifetime only.
                salt = uuid.uuid4().hex
            self._joiner = PairJoiner(self._config.routes, self._config.mirror_timeout_s, salt)
            self._tasks = TaskVocabulary(self._config.tasks, self._config.max_tasks)
            self._groups = {r.candidate_group: r for r in self._config.routes}
            self._groups.update({r.reference_group: r for r in self._config.routes})
            self._build()
            self._started = asyncio.get_running_loop().create_task(self._start())
        return self._joiner

    def _build(self) -> None:
        """The gateway's producer and route controller (no I/O until ``_start``)."""
        # Deferred: the controller (aiokafka, redis) starts only inside a running proxy.
        from quantdrift.gateway.control.controller import RouteController
        from quantdrift.gateway.shadow.publisher import ShadowPublisher
        from quantdrift.schemas.signing import verifier_from_settings

        assert self._settings is not None and self._config is not None
        s = self._settings
        self._publisher = ShadowPublisher(s.kafka, 1.0, hash_prompts=s.hash_prompts)
        self._controller = RouteController(
            s.kafka,
            s.redis.url or "redis://127.0.0.1:6379/0",
            verifier_from_settings(s.signing.keys, s.signing.max_command_age_s),
            key_prefix=s.redis.key_prefix,
            routes=[r.route for r in self._config.routes],
            slice_dimensions=DIMENSIONS,
        )

    async def _start(self) -> None:
        assert self._config is not None and self._settings is not None
        await self._publisher.start()
        await self._controller.start()
        self._expiry = asyncio.get_running_loop().create_task(self._expire_loop())
        log.warning(
            "quantdrift guard: routes %s; pairs to %s",
            ", ".join(r.route for r in self._config.routes),
            self._settings.kafka.topics.pairs,
        )

    async def _expire_loop(self) -> None:
        assert self._joiner is not None and self._config is not None
        while True:
            await asyncio.sleep(min(1.0, self._config.mirror_timeout_s / 4))
            try:
                for join_id in self._joiner.expire(time.time()):
                    log.warning(
                        "quantdrift guard: no silent_model mirror for call %s within %g s "
                        "(%d missing so far)",
                        join_id,
                        self._config.mirror_timeout_s,
                        self._joiner.stats.mirrors_missing,
                    )
            except Exception:
                log.exception("quantdrift guard: expiry failed")

    @property
    def stats(self) -> Any:
        return self._joiner.stats if self._joiner is not None else None

    def serves_reference(self, route: str, tags: Mapping[str, str] | None = None) -> bool:
        """Whether the route's latest applied command keeps this call (with its slice
        ``tags``) off the candidate."""
        applied = self._controller.state(route) if self._controller is not None else None
        return serves_reference(applied, tags or {}, random.random())

    # -- LiteLLM hooks ------------------------------------------------------------------
    async def async_pre_call_hook(
        self, user_api_key_dict: Any, cache: Any, data: dict[str, Any], call_type: Any
    ) -> dict[str, Any]:
        try:
            self._ensure()
            route = self._groups.get(str(data.get("model", "")))
            if route is None or str(data.get("model")) != route.candidate_group:
                return data
            metadata = data.setdefault("metadata", {})
            metadata[JOIN_KEY] = f"litellm-{uuid.uuid4().hex}"
            task = declared_task(_headers(data), data)
            if task is not None and self._tasks is not None:
                task = metadata[TASK_KEY] = self._tasks.admit(task)
            if self.serves_reference(route.route, call_tags(data, task)):
                data["model"] = route.reference_group
                metadata[EXPECT_KEY] = False
            else:
                metadata[EXPECT_KEY] = True
        except Exception:
            log.exception("quantdrift guard: pre-call hook failed; the call goes on unchanged")
        return data

    async def async_log_success_event(
        self, kwargs: dict[str, Any], response_obj: Any, start_time: Any, end_time: Any
    ) -> None:
        try:
            self._log(kwargs, response_obj, start_time, end_time)
        except Exception:
            log.exception("quantdrift guard: could not pair a logged call")

    async def async_log_failure_event(
        self, kwargs: dict[str, Any], response_obj: Any, start_time: Any, end_time: Any
    ) -> None:
        with contextlib.suppress(Exception):
            metadata = _metadata(kwargs)
            if metadata.get("is_silent_experiment") and metadata.get(JOIN_KEY) and self._joiner:
                self._joiner.mirror_failed(str(metadata[JOIN_KEY]))

    def _log(self, kwargs: dict[str, Any], response: Any, start: Any, end: Any) -> None:
        metadata = _metadata(kwargs)
        join_id = metadata.get(JOIN_KEY)
        if not join_id or self._joiner is None or self._config is None:
            return
        group = str(metadata.get("model_group") or "")
        found = self._joiner.lookup(group)
        if found is None:
            self._joiner.stats.unmapped += 1
            return
        route, role = found
        body = response.model_dump() if hasattr(response, "model_dump") else dict(response)
        # The proxy renames the answer's model to the group the user asked for; the pair
        # records what served it (the deployment's model).
        body["model"] = str(kwargs.get("model") or body.get("model") or "")
        request = dict(kwargs.get("optional_params") or {})
        request["messages"] = kwargs.get("messages")
        mirror = bool(metadata.get("is_silent_experiment"))
        precision = route.candidate_precision if role == "candidate" else route.reference_precision
        side = Side(
            group=group,
            output=output_of(body, precision, _ms(start, end), self._config.top_logprobs),
            request={k: request[k] for k in REQUEST_FIELDS if request.get(k) is not None},
            primary=not mirror,
            expects_mirror=bool(metadata.get(EXPECT_KEY)),
            task=str(metadata[TASK_KEY]) if metadata.get(TASK_KEY) else None,
        )
        pair = self._joiner.add(str(join_id), side, time.time())
        if pair is not None and self._publisher is not None:
            self._publisher.offer(pair)


def _metadata(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    params = kwargs.get("litellm_params") or {}
    metadata = params.get("metadata") if isinstance(params, Mapping) else None
    return dict(metadata) if isinstance(metadata, Mapping) else {}


def _headers(data: Mapping[str, Any]) -> dict[str, str]:
    """The caller's request headers (lower-case keys), where the proxy put them."""
    for holder in (data.get("proxy_server_request"), data.get("metadata")):
        headers = holder.get("headers") if isinstance(holder, Mapping) else None
        if isinstance(headers, Mapping):
            return {str(k).lower(): str(v) for k, v in headers.items()}
    return {}


def _ms(start: Any, end: Any) -> float:
    try:
        return max(0.0, (end - start).total_seconds() * 1000)
    except (TypeError, AttributeError):
        return 0.0


guard = QuantdriftGuard()
