"""Arrows point one way: every import in ``src/quantdrift`` obeys docs/architecture.md.

The walk reads every ``import`` with ``ast``, function-local ones included, so an
arrow cannot hide inside a function. The tables are read from the page itself (the
package arrows and the gateway's rooms), so the page and this test cannot disagree:
an arrow is allowed by writing it, with its reason, in the page.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

import quantdrift

ROOT = Path(quantdrift.__file__).resolve().parent
DOC = ROOT.parents[1] / "docs" / "architecture.md"


def _rows(heading: str) -> list[list[str]]:
    """The cells of every table row in the doc's section ``heading`` (header rows aside)."""
    text = DOC.read_text()
    start = text.index(f"\n{heading}\n")
    level = heading.split(" ", 1)[0]
    end = min(
        (i for h in ("\n# ", "\n## ", f"\n{level} ") if (i := text.find(h, start + 1)) > 0),
        default=len(text),
    )
    rows = []
    for line in text[start:end].splitlines():
        if line.startswith("|") and not set(line) <= set("|-: "):
            rows.append([c.strip() for c in line.strip().strip("|").split("|")])
    return rows


def _names(cell: str, groups: dict[str, set[str]]) -> set[str]:
    """``*base*, gateway`` -> the packages; ``nothing`` -> none; ``every package`` -> all."""
    if cell == "every package":
        return {p.name.removesuffix(".py") for p in ROOT.iterdir()} - {"__pycache__"}
    names: set[str] = set()
    for word in (w.strip() for w in cell.split(",")):
        if word.startswith("*"):
            names |= groups[word.strip("*")]
        elif word and word != "nothing":
            names.add(word.strip("`"))
    return names


def package_table() -> dict[str, set[str]]:
    """docs/architecture.md's package table: package -> the packages it may import."""
    groups: dict[str, set[str]] = {}
    allowed: dict[str, set[str]] = {}
    for cells in _rows("### Package arrows"):
        if cells[0] in ("group", "package"):
            continue
        if cells[0].startswith("*"):
            groups[cells[0].strip("*")] = _names(cells[1], groups)
        else:
            allowed[cells[0].strip("`")] = _names(cells[1], groups)
    return allowed


# package -> the quantdrift packages it may import (itself always allowed).
ALLOWED = package_table()
# CLI helpers every command shares (argument types, the settings a command runs with, the
# exit-code map, progress bars), and the server start that ``gateway`` and ``collector``
# share (same parts, another app).
CLI_SHARED = {"common", "settings", "progress", "exits", "serving"}
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


@cache  # one walk of the source tree serves every test here
def all_arrows() -> tuple[Arrow, ...]:
    return tuple(a for path in sorted(ROOT.rglob("*.py")) for a in arrows(path))


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
    assert not [p for p in missing if p not in ALLOWED], (
        "add the new package to docs/architecture.md's package table"
    )


def test_the_walk_sees_function_local_imports() -> None:
    """Guard the guard: a known function-local import is found as local."""
    found = list(arrows(ROOT / "embedding" / "minilm.py"))
    assert found and all(a.source == "quantdrift.embedding.minilm" for a in found)
    assert any(a.local for a in all_arrows())


def test_no_arrow_the_table_forbids() -> None:
    bad = []
    for a in all_arrows():
        src, dst = package_of(a.source), package_of(a.target)
        if not dst or src == dst or not is_module(a.target):
            continue
        if dst not in ALLOWED.get(src, set()):
            bad.append(a.where)
    assert not bad, "imports docs/architecture.md's package table forbids:\n" + "\n".join(
        sorted(set(bad))
    )


# The gateway's rooms (docs/architecture.md, "The gateway's modules"): room -> the rooms
# it may import. Arrows point downward; every room may read the package's shared leaves,
# which import no room. ``quantdrift.gateway`` itself is the package's lazy face, above all.
GATEWAY_LEAVES = {"gateway_config", "openai_wire", "telemetry"}


def rooms_table() -> dict[str, set[str]]:
    """docs/architecture.md's room table: room -> the rooms below it that it may import."""
    rows = {
        cells[0].strip("`/"): cells[2]
        for cells in _rows("## The gateway's modules")
        if len(cells) == 3 and cells[0].startswith("`") and cells[0].endswith("/`")
    }
    order = list(rows)  # the table lists the rooms top down
    return {
        room: set(order[order.index(room) + 1 :])
        if said == "every room below"
        else {w.strip() for w in said.split(",") if w.strip()} - {"nothing"}
        for room, said in rows.items()
    }


ROOMS = rooms_table()


def room_of(module: str) -> str | None:
    """``quantdrift.gateway.chain.planning`` -> ``chain``; a shared leaf -> ``leaf``."""
    parts = module.split(".")
    if parts[:2] != ["quantdrift", "gateway"] or len(parts) < 3:
        return None
    return "leaf" if parts[2] in GATEWAY_LEAVES else parts[2]


def test_every_gateway_module_sits_in_a_room() -> None:
    gateway = ROOT / "gateway"
    flat = {p.stem for p in gateway.glob("*.py")} - {"__init__"}
    rooms = {p.name for p in gateway.iterdir() if (p / "__init__.py").exists()}
    assert flat == GATEWAY_LEAVES, "a new gateway module belongs in a room"
    assert rooms == set(ROOMS), "add the new room to docs/architecture.md's room table"
    assert all(any((gateway / room).glob("[!_]*.py")) for room in ROOMS)


def test_the_gateways_rooms_point_downward() -> None:
    """Each room imports only the rooms below it (ROOMS) and the shared leaves; the leaves
    import no room. Control (the RouteController, target mapping, preflight gate) thus
    reads nothing of serving but the config, and serving reads control, never back."""
    bad, seen = set(), set()
    for a in all_arrows():
        src, dst = room_of(a.source), room_of(a.target)
        if src is None or dst is None or src == dst or dst == "leaf" or not is_module(a.target):
            continue
        seen.add((src, dst))
        if dst not in ROOMS.get(src, set()):
            bad.add(f"{a.where} ({src} -> {dst})")
    assert not bad, "arrows between the gateway's rooms that ROOMS forbids:\n" + "\n".join(
        sorted(bad)
    )
    # Guard the guard: the walk sees the arrows the rooms are known to have.
    assert {("http", "chain"), ("chain", "upstream"), ("upstream", "guards")} <= seen


def test_the_tables_are_read_from_the_page() -> None:
    """Guard the guard: the parse finds both tables whole, and rooms point only down."""
    assert len(ALLOWED) >= 20 and ALLOWED["errors"] == set() and "breaker" in ALLOWED["streams"]
    assert ALLOWED["cli"] >= set(ALLOWED) - {"cli", "__main__"}
    assert ROOMS["guards"] == set() and ROOMS["chain"] == {"upstream", "guards"}
    order = list(ROOMS)
    assert all(order.index(b) > order.index(a) for a, below in ROOMS.items() for b in below)


def test_lab_only_code_stays_out_of_production_packages() -> None:
    bad = {
        a.where
        for a in all_arrows()
        if package_of(a.target) in LAB_ONLY and package_of(a.source) not in {"cli", *LAB_ONLY}
    }
    assert not bad, "\n".join(sorted(bad))


def test_commands_do_not_import_each_other() -> None:
    """A CLI module parses, calls a service and prints; shared code is not in another
    command. A command's runner may read its own flags module (a constant, a choice
    list), and a flags module reads the shared argument helpers only."""

    def allowed(source: str, target: str) -> bool:
        if target.split(".")[2] in CLI_SHARED:
            return not source.startswith("quantdrift.cli.parsers.") or target == (
                "quantdrift.cli.common"
            )
        return target == f"quantdrift.cli.parsers.{source.rpartition('.')[2]}"

    bad = {
        a.where
        for a in all_arrows()
        if a.source.startswith("quantdrift.cli.")
        and a.target.startswith("quantdrift.cli.")
        and is_module(a.target)
        and a.target != "quantdrift.cli.parsers"
        and not allowed(a.source, a.target)
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
    dependency, with a one-line reason above it. The command line is no exception: the
    registry imports a command's flags for its ``--help`` and what it runs only when it
    runs (cli/__init__), so a command imports at its module's top."""
    bad = []
    for path in sorted(ROOT.rglob("*.py")):
        lines = path.read_text().splitlines()
        for stmt in _local_import_blocks(path):
            above = lines[stmt.lineno - 2].strip() if stmt.lineno >= 2 else ""
            if not above.startswith("#") and "#" not in lines[stmt.lineno - 1]:
                bad.append(f"{module_name(path)}:{stmt.lineno}: {ast.unparse(stmt)}")
    assert not bad, "function-local imports without a reason:\n" + "\n".join(bad)
