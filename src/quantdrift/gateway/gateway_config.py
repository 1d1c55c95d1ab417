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
routes:
  cs-agent/int4: {candidate: int4, reference: bf16, teacher_forced: true}
```

Kafka, Redis and signing keys are not here: they come from ``Settings``
(``QUANTDRIFT_*``), like every other command.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from quantdrift.errors import ConfigError
from quantdrift.gateway.degeneration import DegenerationConfig

_ROUTE = re.compile(r"^[A-Za-z0-9._:/@-]+$")


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RouteConfig(_Frozen):
    """One route: which precision is the candidate, which the reference."""

    candidate: str
    reference: str
    teacher_forced: bool = False
    shadow_sample_rate: float | None = Field(default=None, ge=0, le=1)
    noise_sample_rate: float | None = Field(default=None, ge=0, le=1)


class TimeoutConfig(_Frozen):
    """Per upstream attempt: connect, between two reads, whole attempt."""

    connect_s: float = Field(default=2.0, gt=0)
    read_s: float = Field(default=60.0, gt=0)
    total_s: float = Field(default=300.0, gt=0)
    shadow_total_s: float = Field(default=300.0, gt=0)


class JsonGuardConfig(_Frozen):
    max_whitespace_run: int | None = Field(default=64, ge=1)
    max_depth: int = Field(default=64, ge=1)


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
    sample_salt: str = ""
    timeouts: TimeoutConfig = TimeoutConfig()
    max_connections: int = Field(default=200, ge=1)
    shadow_concurrency: int = Field(default=16, ge=1)
    shadow_queue: int = Field(default=10_000, ge=1)
    json_guard: JsonGuardConfig = JsonGuardConfig()
    degeneration: DegenerationConfig = DegenerationConfig()
    # Streams that do not ask for JSON: chunks held back before the first byte goes
    # out, so a loop or a failure in the first tokens still falls back silently.
    stream_holdback_tokens: int = Field(default=48, ge=0)
    # Ask upstreams for logprobs on user calls too, for the entropy probe.
    logprobs_on_user_calls: bool = True
    top_logprobs: int = Field(default=5, ge=0, le=20)

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

    def shadow_rate(self, route: str) -> float:
        r = self.routes[route].shadow_sample_rate
        return self.shadow_sample_rate if r is None else r

    def noise_rate(self, route: str) -> float:
        r = self.routes[route].noise_sample_rate
        return self.noise_sample_rate if r is None else r


def parse_config(data: dict[str, Any]) -> GatewayConfig:
    try:
        return GatewayConfig.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first["loc"]) or "<root>"
        raise ConfigError(f"gateway config: {loc}: {first['msg']}") from exc


def load_config(path: Path | str) -> GatewayConfig:
    """Read and validate a YAML gateway config; ConfigError says which field is wrong."""
    try:
        data = yaml.safe_load(Path(path).read_text())
    except OSError as exc:
        raise ConfigError(f"gateway config {path}: {exc.strerror or exc}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"gateway config {path}: invalid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"gateway config {path}: expected a mapping at the top")
    return parse_config(data)
