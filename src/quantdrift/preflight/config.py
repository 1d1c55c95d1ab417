"""``PREFLIGHT.yaml``: endpoints, files and thresholds for the launch checklist.

Every section is optional; a check whose inputs are missing says ``skipped``
and names the key to set. Relative paths are resolved against the YAML's folder,
so an example directory can be moved as a whole.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from quantdrift.config_env import first_problem, read_yaml_mapping
from quantdrift.errors import ConfigError


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class EndpointConfig(_Section):
    url: str
    model: str | None = None
    api_key: str | None = None
    timeout_s: float = Field(default=300.0, gt=0)


Language = Literal["en", "zh", "ja"]


def _all_languages() -> list[Language]:
    return ["en", "zh", "ja"]


class NeedleConfig(_Section):
    fact: str
    question: str
    answer: str
    language: Language = "en"


class LeakageConfig(_Section):
    calibration: Path | None = None
    evaluation: Path | None = None
    domains: list[str] = Field(default_factory=list)
    n_words: int = Field(default=8, ge=1)
    n_cjk: int = Field(default=5, ge=1)
    item_overlap: float = Field(default=0.5, gt=0, le=1)
    near_duplicate: float = Field(default=0.8, gt=0, le=1)
    min_items_per_domain: int = Field(default=1, ge=0)


class SalientConfig(_Section):
    checkpoint: Path | None = None
    min_bits: float = Field(default=8.0, gt=0)
    # Regexes of tensor names; None = the first and last blocks' MLP down projections.
    outlier_layers: list[str] | None = None
    min_share_high_precision: float = Field(default=0.0, ge=0, le=1)


class NiahConfig(_Section):
    lengths: list[int] | None = None  # None: from the endpoints' context length
    depths: list[float] = Field(default_factory=lambda: [0.1, 0.5, 0.9])
    per_cell: int = Field(default=2, ge=1)
    needles: list[NeedleConfig] | None = None
    # Every language runs at every length; each (language, length) cell is judged alone.
    languages: list[Language] = Field(default_factory=_all_languages, min_length=1)
    max_tokens: int = Field(default=32, ge=1)
    floor: float = Field(default=0.9, ge=0, le=1)
    tolerance: float = Field(default=0.05, ge=0, le=1)


class ScalesConfig(_Section):
    checkpoint: Path | None = None
    lo: float = Field(default=1e-4, gt=0)
    hi: float = Field(default=1e4, gt=0)


class WarmupConfig(_Section):
    buckets: list[int] = Field(default_factory=lambda: [64, 512])
    steady: int = Field(default=5, ge=2)
    max_tokens: int = Field(default=16, ge=1)
    max_ratio: float = Field(default=3.0, gt=1)


class MemoryConfig(_Section):
    serving_config: Path | None = None
    lo: float = 0.90
    hi: float = 0.92


class ShadowLinkConfig(_Section):
    expected_share: float = Field(default=0.05, ge=0, le=1)
    recorded_pairs: Path | None = None  # None: the lab's shipped pairs
    max_pairs: int = Field(default=200, ge=1)
    p99_ms: float = Field(default=10.0, gt=0)
    roundtrip_timeout_s: float = Field(default=30.0, gt=0)
    roundtrip: bool = True


class DrillConfig(_Section):
    max_apply_s: float = Field(default=1.0, gt=0)
    timeout_s: float = Field(default=10.0, gt=0)


class LoadConfig(_Section):
    url: str | None = None  # None: the gateway's URL
    peak_rps: float | None = Field(default=None, gt=0)
    multiplier: float = Field(default=1.5, gt=0)
    duration_s: float = Field(default=30.0, gt=0)
    max_tokens: int = Field(default=16, ge=1)
    prompt: str = "Reply with one short sentence about the weather."
    max_in_flight: int = Field(default=256, ge=1)
    max_error_rate: float = Field(default=0.01, ge=0, le=1)
    max_p99_s: float | None = Field(default=None, gt=0)
    stall_s: float = Field(default=10.0, gt=0)
    burst_window_s: float = Field(default=10.0, gt=0)
    burst_error_rate: float = Field(default=0.2, ge=0, le=1)
    max_rss_growth: float = Field(default=0.25, ge=0)
    pids: dict[str, int] = Field(default_factory=dict)  # e.g. {gateway: 123, upstream: 456}
    require_rss: bool = True


class PerplexityConfig(_Section):
    texts: Path | None = None  # JSONL of {prompt, text, domain}; None: the built-in set
    tolerance: float = Field(default=0.05, ge=0)


class SignoffConfig(_Section):
    """Who must approve: recorded in the report, so its page shows the same policy."""

    required: int = Field(default=2, ge=1)
    distinct_keys: bool = False


class PreflightConfig(_Section):
    candidate: EndpointConfig | None = None
    reference: EndpointConfig | None = None
    gateway_url: str | None = None
    gateway_config: Path | None = None
    route: str | None = None
    report: Path = Path("preflight-report.json")
    html: Path | None = None  # None: the report's path with .html
    vetoes: list[str] = Field(default_factory=lambda: ["niah", "perplexity"])
    waivers: dict[str, str] = Field(default_factory=dict)  # check id -> why a skip is fine
    seed: int = 0
    calibration_leakage: LeakageConfig = LeakageConfig()
    salient_weights: SalientConfig = SalientConfig()
    niah: NiahConfig = NiahConfig()
    fp8_scales: ScalesConfig = ScalesConfig()
    warmup: WarmupConfig = WarmupConfig()
    memory_utilization: MemoryConfig = MemoryConfig()
    shadow_link: ShadowLinkConfig = ShadowLinkConfig()
    switch_drill: DrillConfig = DrillConfig()
    load: LoadConfig = LoadConfig()
    perplexity: PerplexityConfig = PerplexityConfig()
    signoff: SignoffConfig = SignoffConfig()


_PATH_KEYS = {
    "gateway_config": None,
    "report": None,
    "html": None,
    "calibration_leakage": ("calibration", "evaluation"),
    "salient_weights": ("checkpoint",),
    "fp8_scales": ("checkpoint",),
    "memory_utilization": ("serving_config",),
    "shadow_link": ("recorded_pairs",),
    "perplexity": ("texts",),
}


def _resolve(data: dict[str, Any], base: Path) -> dict[str, Any]:
    def fix(v: Any) -> Any:
        return str(base / v) if isinstance(v, str) and not Path(v).is_absolute() else v

    out = dict(data)
    for key, sub in _PATH_KEYS.items():
        if key not in out or out[key] is None:
            continue
        if sub is None:
            out[key] = fix(out[key])
        elif isinstance(out[key], dict):
            out[key] = {k: (fix(v) if k in sub else v) for k, v in out[key].items()}
    return out


def _snake_keys(data: dict[str, Any]) -> dict[str, Any]:
    # YAML keys may use the check ids (calibration-leakage) or snake case.
    return {k.replace("-", "_"): v for k, v in data.items()}


def parse(data: dict[str, Any]) -> PreflightConfig:
    try:
        return PreflightConfig.model_validate(_snake_keys(data))
    except ValidationError as exc:
        raise ConfigError(first_problem(exc, "preflight config")) from exc


def load(path: Path) -> PreflightConfig:
    data = _snake_keys(read_yaml_mapping(path, "preflight config"))
    return parse(_resolve(data, path.parent))
