"""The documentation: the mkdocs site builds with --strict, the README stays short.

The build is the real ``mkdocs build --strict`` (the same as ``make docs``) into a
temporary directory: a link to a missing page or anchor, or a page left out of the
nav, fails it.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Internal tracker references do not belong in user docs ("issue 11", "#14").
ISSUE_REF = re.compile(r"\bissues? \d+\b|(?<![\w&/])#\d+\b", re.I)


def test_site_builds_strict(tmp_path: Path) -> None:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    out = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert (tmp_path / "site" / "index.html").exists()
    assert (tmp_path / "site" / "gateway" / "index.html").exists()


def test_readme_is_short_and_leads() -> None:
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 200
    assert "make demo" in text and "make test" in text


def test_no_internal_issue_references() -> None:
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("**/*.md"))]
    found = [
        f"{p.relative_to(ROOT)}: {m.group(0)!r}"
        for p in pages
        if p.name != "benchmarks.md"  # BENCHMARKS.md, written by bench/run_all.py
        for m in ISSUE_REF.finditer(p.read_text())
    ]
    assert not found, found
