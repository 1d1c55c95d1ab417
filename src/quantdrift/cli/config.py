"""``quantdrift config show|validate|reference``: the settings, as the commands see them.

* ``show [--config FILE] [--json]``: every effective setting, secrets masked,
  and where each value came from (env, the file, the stack state, default);
* ``validate FILE [--kind gateway|policy|preflight|settings]``: every error of a
  YAML file at once, one line each; exit 2 if there is any;
* ``reference``: the Markdown reference of every setting (``docs/settings.md``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from pydantic import BaseModel, ValidationError

from quantdrift.breaker.policy import Policy, RoutePolicy
from quantdrift.cli.parsers.config import KINDS
from quantdrift.cli.settings import load_settings, read_settings_file, with_stack
from quantdrift.config import Settings
from quantdrift.config_env import (
    error_lines,
    fields,
    lookup,
    masked,
    read_yaml,
    reference_markdown,
    source_of,
    unknown_keys,
)
from quantdrift.errors import InputError
from quantdrift.gateway.gateway_config import GatewayConfig
from quantdrift.preflight.config import PreflightConfig


def show(args: argparse.Namespace) -> int:
    loaded = load_settings(args.config)
    effective = with_stack(loaded)
    file_data = read_settings_file(args.config) if args.config else None
    rows = []
    for f in fields(Settings):
        value = lookup(effective, f.path)
        from_stack = {f.path} if value != lookup(loaded, f.path) else set()
        rows.append(
            {
                "name": f.env,
                "value": masked(f, value),
                "source": source_of(f, os.environ, file_data, str(args.config), from_stack),
            }
        )
    if args.json:
        print(json.dumps(rows))
        return 0
    width = max(len(r["name"]) for r in rows)
    for r in rows:
        print(f"{r['name'].ljust(width)}  {r['value']}  ({r['source']})")
    return 0


def validate(args: argparse.Namespace) -> int:
    data = read_yaml(args.file)
    if not isinstance(data, dict):
        raise InputError(f"{args.file}: expected a mapping at the top")
    kind = args.kind or guess_kind(data)
    if kind is None:
        raise InputError(
            f"{args.file}: cannot tell which file this is from its keys; give --kind "
            f"({', '.join(KINDS)})"
        )
    problems = problems_of(kind, data)
    for line in problems:
        sys.stderr.write(f"{args.file}: {line}\n")
    if problems:
        return 2
    print(f"{args.file}: valid {kind} file")
    return 0


def guess_kind(data: dict[str, Any]) -> str | None:
    """Which model a YAML file is for, from its top-level keys."""
    keys = {str(k).replace("-", "_") for k in data}
    if "pools" in keys or "precisions" in keys:
        return "gateway"
    scores = {
        "policy": len(keys & set(Policy.model_fields)),
        "preflight": len(keys & set(PreflightConfig.model_fields)),
        "settings": len(keys & set(Settings.model_fields)),
        "gateway": len(keys & set(GatewayConfig.model_fields)),
    }
    best = max(scores, key=lambda k: scores[k])
    return best if scores[best] else None


# The model each kind of file is read into.
MODELS: dict[str, type[BaseModel]] = {
    "gateway": GatewayConfig,
    "policy": Policy,
    "preflight": PreflightConfig,
    "settings": Settings,
}


def problems_of(kind: str, data: dict[str, Any]) -> list[str]:
    """Every problem of ``data`` as a ``kind`` file, one line each (empty: valid)."""
    model = MODELS[kind]
    if kind == "preflight":
        data = {k.replace("-", "_"): v for k, v in data.items()}
    problems = unknown_keys(data, model) if kind == "settings" else []
    try:
        parsed = model.model_validate(data)
    except ValidationError as exc:
        return problems + error_lines(exc)
    if kind == "policy":
        problems += _route_policy_problems(parsed)
    return problems


def _route_policy_problems(policy: Any) -> list[str]:
    """Each route override checked like the worker will check it, all at once."""
    out = []
    for route, override in policy.routes.items():
        try:
            RoutePolicy.model_validate({**policy.default.model_dump(), **override})
        except ValidationError as exc:
            out += [f"routes.{route}.{line}" for line in error_lines(exc)]
    return out


def reference_text() -> str:
    """The generated reference (``docs/settings.md``)."""
    return reference_markdown(
        [
            (
                "Environment (and `worker --config`)",
                "Read by every command. In a settings YAML file the same names are nested "
                "keys: `QUANTDRIFT_KAFKA__BOOTSTRAP_SERVERS` is `kafka: {bootstrap_servers: ...}`.",
                Settings,
                True,
            ),
            (
                "Gateway YAML",
                "`quantdrift gateway --config FILE`; see `examples/gateway.yaml`. "
                "`<name>` is a route or pool name of your choosing.",
                GatewayConfig,
                False,
            ),
            (
                "Policy YAML",
                "The breaker's decision rule. `default:` holds every field below; "
                "`routes: {ROUTE: {...}}` overrides only the fields it names, for one route.",
                Policy,
                False,
            ),
            (
                "Preflight YAML",
                "`quantdrift preflight --config FILE`; see `examples/preflight.yaml`. "
                "Check ids may be written with dashes (`calibration-leakage`).",
                PreflightConfig,
                False,
            ),
        ]
    )


def reference(args: argparse.Namespace) -> int:
    sys.stdout.write(reference_text())
    return 0
