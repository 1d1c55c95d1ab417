"""The Dockerfile's properties, read from the file (no Docker engine runs here).

What is checked is what made the single-stage image fail: a worker runs as an
unprivileged user and Faust must be able to write its data directory; the runtime
image carries no build tools; the container reports its health.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    lines: list[str] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        lines.append(pending + line)
        pending = ""
    assert not pending, "a continuation line ends the file"
    return [(ln.split(None, 1)[0].upper(), ln.split(None, 1)[1]) for ln in lines]


@pytest.fixture(scope="module")
def stages() -> list[list[tuple[str, str]]]:
    out: list[list[tuple[str, str]]] = []
    for op, args in instructions((ROOT / "Dockerfile").read_text()):
        if op == "FROM":
            out.append([])
        assert out, "an instruction before the first FROM"
        out[-1].append((op, args))
    return out


def env_of(stage: list[tuple[str, str]]) -> dict[str, str]:
    env: dict[str, str] = {}
    for op, args in stage:
        if op == "ENV":
            for item in shlex.split(args):
                key, _, value = item.partition("=")
                env[key] = value
    return env


def test_multi_stage_and_the_runtime_copies_only_the_venv(
    stages: list[list[tuple[str, str]]],
) -> None:
    assert len(stages) >= 2
    build, runtime = stages[0], stages[-1]
    assert re.search(r"\bAS build\b", build[0][1], re.I)
    copies = [args for op, args in runtime if op == "COPY"]
    assert copies == ["--from=build /opt/quantdrift /opt/quantdrift"]
    # Installs happen in the build stage only: no pip (or compiler) in the final layers.
    assert not any(op == "RUN" and "pip install" in args for op, args in runtime)
    torch = next(i for i, (op, a) in enumerate(build) if "torch==2.13.0" in a)
    project = next(i for i, (op, a) in enumerate(build) if op == "RUN" and "'.[" in a)
    assert torch < project, "the pinned CPU torch must come before the project's extras"
    assert "worker" in build[project][1] and "gateway" in build[project][1]


def test_non_root_with_a_writable_data_directory(stages: list[list[tuple[str, str]]]) -> None:
    runtime = stages[-1]
    users = [args for op, args in runtime if op == "USER"]
    assert users and users[-1].split(":")[0] not in {"root", "0"}
    uid = users[-1].split(":")[0]
    env = env_of(runtime)
    datadir = env["FAUST_DATADIR"]
    workdir = [args for op, args in runtime if op == "WORKDIR"][-1]
    assert datadir.startswith(workdir + "/"), "Faust's data directory lies under the workdir"
    setup = " ".join(args for op, args in runtime if op == "RUN")
    # The directory exists and belongs to the user the container runs as.
    assert f"mkdir -p {datadir}" in setup
    assert re.search(rf"chown -R {uid}(:\d+)? {re.escape(workdir)}\b", setup)
    assert f"--uid {uid}" in setup
    # The USER comes after the chown (or the files would belong to root).
    order = [op for op, _ in runtime]
    assert order.index("USER") > max(i for i, op in enumerate(order) if op == "RUN")
    volumes = [args for op, args in runtime if op == "VOLUME"]
    assert volumes and workdir in volumes[-1]


def test_healthcheck_probes_the_worker_by_default(stages: list[list[tuple[str, str]]]) -> None:
    runtime = stages[-1]
    checks = [args for op, args in runtime if op == "HEALTHCHECK"]
    assert len(checks) == 1
    assert "CMD" in checks[0] and "HEALTHCHECK_URL" in checks[0]
    assert "--start-period=" in checks[0]
    env = env_of(runtime)
    cmd = next(args for op, args in runtime if op == "CMD")
    port = re.search(r":(\d+)/", env["HEALTHCHECK_URL"])
    assert port and port.group(1) in cmd, "HEALTHCHECK probes the port CMD serves on"
    assert env["HEALTHCHECK_URL"].endswith("/healthz")


def test_the_image_installs_what_the_build_context_holds() -> None:
    """pyproject names README.md and LICENSE: both must be copied before the install."""
    text = (ROOT / "Dockerfile").read_text()
    copy = re.search(r"^COPY (.+) \./$", text, re.M)
    assert copy is not None
    assert {"pyproject.toml", "README.md", "LICENSE"} <= set(copy.group(1).split())
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert not {"src", "pyproject.toml", "README.md", "LICENSE"} & set(ignored)
