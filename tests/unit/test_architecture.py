"""Arrows point one way: every import in ``src/quantdrift`` obeys ARCHITECTURE.md's table.

The walk reads every ``import`` with ``ast``, function-local ones included, so an
arrow cannot hide inside a function. The table below is ARCHITECTURE.md's package
table in code; where this reading adds to it, the reason is written beside it.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import quantdrift

ROOT = Path(quantdrift.__file__).resolve().parent

# Shared leaves below every package: the error tree and settings (built at the entry
# point, passed down), the failpoint seam, packaged data (the lab's prompt set, which
# eval splits recorded pairs by), and the Kafka client settings that the gateway, the
# worker and every topic-reading command share.
# The task supervisor (stdlib only) is a seam like the failpoints: every long-lived task
# in the gateway, the relay and the alert forwarder runs under it. config_env reads the
# environment for the settings (the stack's redaction of URLs it shows is a leaf too).
ERRORS = {"errors"}
BASE = ERRORS | {"config", "config_env", "failpoints", "data", "supervision"}
KAFKA = {"kafka_clients"}

PURE = {"schemas", "detectors"}
MODELS = PURE | {"embedding"}
BREAKER = PURE | {"breaker"}

# package -> the quantdrift packages it may import (itself always allowed).
ALLOWED: dict[str, set[str]] = {
    "errors": set(),
    "config": ERRORS,
    "config_env": ERRORS | {"config", "stack"},
    "supervision": set(),
    "failpoints": set(),
    "data": set(),
    "kafka_clients": ERRORS | {"config"},
    "schemas": ERRORS,
    "detectors": ERRORS | {"schemas"},
    "embedding": BASE | PURE,
    "breaker": BASE | PURE,
    # The worker also serves the status page on its own web server: status sits
    # beside streams and imports only schemas and breaker, so no cycle can form.
    "streams": BASE | KAFKA | MODELS | BREAKER | {"status"},
    "gateway": BASE | KAFKA | PURE,
    "replay": BASE | KAFKA | MODELS | BREAKER,
    "evaluation": BASE | MODELS | BREAKER,
    # Preflight scores probe pairs through the one scorer factory (embedding), and
    # its switch drill runs the console's manual step exactly as on-call does.
    "preflight": BASE | KAFKA | MODELS | {"gateway", "services"},
    # The corpus recorder asks engines through the gateway's own upstream client (its
    # pairs are what a gateway publishes) and starts engines on free ports.
    "lab": BASE | PURE | {"gateway", "stack"},
    "alerts": BASE | KAFKA | BREAKER,
    "status": BASE | BREAKER,
    "stack": BASE,
    "integrations": BASE | KAFKA | BREAKER | {"gateway"},
    # Services sit above every package (ARCHITECTURE's table: "everything above"): the
    # console's status reads a route's verdict in the verdict API's own words.
    "services": BASE
    | KAFKA
    | MODELS
    | BREAKER
    | {"streams", "gateway", "replay", "evaluation", "alerts", "status", "stack", "integrations"},
    # The demo composes a whole guard loop, like a service (not a production path).
    "demo": BASE
    | KAFKA
    | MODELS
    | BREAKER
    | {"streams", "gateway", "replay", "evaluation", "alerts", "status", "stack", "services"},
    "cli": {p.name.removesuffix(".py") for p in ROOT.iterdir()} - {"__pycache__"},
    "__main__": {"cli"},
}
# The OpenTelemetry hooks: a leaf (stdlib, and opentelemetry only when it is on) that the
# gateway, the worker and the console call with what they already hold, so events leave
# from where they happen without those packages reaching into the integrations.
HOOKS = {"quantdrift.integrations", "quantdrift.integrations.otel"}
# CLI helpers every command shares (argument types, the exit-code map, progress bars), and
# the server start that ``gateway`` and ``collector`` share (same parts, another app).
CLI_SHARED = {"common", "progress", "exits", "serving"}
# Imported by the command line (and the lab's own tooling) only.
LAB_ONLY = {"lab"}


@dataclass(frozen=True, slots=True)
class Arrow:
    source: str  # dotted module that imports
    target: str  # dotted module imported
    line: int
    local: bool  # inside a function

    @property
    def where(self) -> str:
        return f"{self.source}:{self.line} -> {self.target}"


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def arrows(path: Path) -> Iterator[Arrow]:
    """Every quantdrift import in ``path``, with relative imports resolved."""
    source = module_name(path)
    package = source if path.name == "__init__.py" else source.rpartition(".")[0]
    tree = ast.parse(path.read_text(), str(path))
    top = {id(node) for node in tree.body}
    for node in ast.walk(tree):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            # ``from quantdrift.x import y`` may name a submodule y: count both.
            targets = [base, *(f"{base}.{alias.name}" for alias in node.names)]
        for target in targets:
            if target == "quantdrift" or target.startswith("quantdrift."):
                yield Arrow(source, target, node.lineno, id(node) not in top)


def all_arrows() -> list[Arrow]:
    return [a for path in sorted(ROOT.rglob("*.py")) for a in arrows(path)]


def package_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def is_module(dotted: str) -> bool:
    rel = Path(*dotted.split(".")[1:])
    return (ROOT / rel).with_suffix(".py").exists() or (ROOT / rel / "__init__.py").exists()


def test_every_package_is_in_the_table() -> None:
    packages = {p.name.removesuffix(".py") for p in ROOT.iterdir() if p.name != "__pycache__"}
    packages -= {"__init__", "py.typed"}
    missing = sorted(p for p in packages if (ROOT / p).is_dir() or p.endswith(".py"))
    assert not [p for p in missing if p not in ALLOWED], "add the new package to ALLOWED"


def test_the_walk_sees_function_local_imports() -> None:
    """Guard the guard: a known function-local import is found as local."""
    found = list(arrows(ROOT / "embedding" / "minilm.py"))
    assert found and all(a.source == "quantdrift.embedding.minilm" for a in found)
    assert any(a.local for a in all_arrows())


def test_no_arrow_the_table_forbids() -> None:
    bad = []
    for a in all_arrows():
        src, dst = package_of(a.source), package_of(a.target)
        if not dst or src == dst or not is_module(a.target) or a.target in HOOKS:
            continue
        if dst not in ALLOWED.get(src, set()):
            bad.append(a.where)
    assert not bad, "imports ARCHITECTURE.md's table forbids:\n" + "\n".join(sorted(set(bad)))


def test_the_gateways_control_side_imports_nothing_of_serving() -> None:
    """ARCHITECTURE: the gateway is serving apart from control. ``gateway.control`` (the
    RouteController, target mapping, preflight gate) reads the gateway's config and
    nothing else of the serving side; serving reads control, never the other way."""
    bad = {
        a.where
        for a in all_arrows()
        if a.source.startswith("quantdrift.gateway.control")
        and a.target.startswith("quantdrift.gateway.")
        and not a.target.startswith("quantdrift.gateway.control")
        and a.target != "quantdrift.gateway.gateway_config"
        and is_module(a.target)
    }
    found = {a.source for a in all_arrows() if a.source.startswith("quantdrift.gateway.control.")}
    assert found >= {
        "quantdrift.gateway.control.controller",
        "quantdrift.gateway.control.targets",
        "quantdrift.gateway.control.preflight_gate",
    }
    assert not bad, "\n".join(sorted(bad))


def test_lab_only_code_stays_out_of_production_packages() -> None:
    bad = {
        a.where
        for a in all_arrows()
        if package_of(a.target) in LAB_ONLY and package_of(a.source) not in {"cli", *LAB_ONLY}
    }
    assert not bad, "\n".join(sorted(bad))


def test_commands_do_not_import_each_other() -> None:
    """A CLI module parses, calls a service and prints; shared code is not in another command."""
    bad = {
        a.where
        for a in all_arrows()
        if a.source.startswith("quantdrift.cli.")
        and a.target.startswith("quantdrift.cli.")
        and a.target.split(".")[2] not in CLI_SHARED
        and is_module(a.target)
    }
    assert not bad, "\n".join(sorted(bad))


def test_no_private_name_crosses_a_package() -> None:
    """``from quantdrift.x import _y`` in another package is an arrow to a detail."""
    bad = {
        a.where
        for a in all_arrows()
        if a.target.rpartition(".")[2].startswith("_")
        and not a.target.rpartition(".")[2].startswith("__")
        and package_of(a.source) != package_of(a.target)
        and not is_module(a.target)
    }
    assert not bad, "\n".join(sorted(bad))


@pytest.mark.parametrize(
    ("source", "target", "forbidden"),
    [
        ("gateway", "preflight", True),
        ("streams", "gateway", True),
        ("evaluation", "lab", True),
        ("schemas", "breaker", True),
        ("cli", "lab", False),
        ("streams", "breaker", False),
    ],
)
def test_the_table_reads_as_the_document_says(source: str, target: str, forbidden: bool) -> None:
    assert (target not in ALLOWED[source]) is forbidden


def test_one_definition_of_the_verdict_thresholds() -> None:
    """The worker, replay and eval attach the same per-pair thresholds: one function."""
    defs = [
        module_name(path)
        for path in sorted(ROOT.rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.FunctionDef) and node.name == "thresholds_for"
    ]
    assert defs == ["quantdrift.breaker.policy"]


def _local_import_blocks(path: Path) -> Iterator[ast.stmt]:
    """The first statement of each run of function-local imports (TYPE_CHECKING aside)."""
    tree = ast.parse(path.read_text())
    for owner in ast.walk(tree):
        if owner is tree or (
            isinstance(owner, ast.If) and "TYPE_CHECKING" in ast.unparse(owner.test)
        ):
            continue
        for field_name in ("body", "orelse", "finalbody", "handlers"):
            body = getattr(owner, field_name, None)
            if not isinstance(body, list):
                continue
            for i, stmt in enumerate(body):
                is_import = isinstance(stmt, (ast.Import, ast.ImportFrom))
                starts_run = i == 0 or not isinstance(body[i - 1], (ast.Import, ast.ImportFrom))
                if is_import and starts_run:
                    yield stmt


def test_function_local_imports_say_why() -> None:
    """A function-local import hides an arrow; one stays only to defer a heavy or optional
    dependency, with a one-line reason above it. The command modules are exempt: every
    command defers its imports so that ``quantdrift --help`` stays fast (cli/__init__)."""
    bad = []
    for path in sorted(ROOT.rglob("*.py")):
        if path.parent.name == "cli":
            continue
        lines = path.read_text().splitlines()
        for stmt in _local_import_blocks(path):
            above = lines[stmt.lineno - 2].strip() if stmt.lineno >= 2 else ""
            if not above.startswith("#") and "#" not in lines[stmt.lineno - 1]:
                bad.append(f"{module_name(path)}:{stmt.lineno}: {ast.unparse(stmt)}")
    assert not bad, "function-local imports without a reason:\n" + "\n".join(bad)
