"""Headless Chromium (Debian's package) for the pages the tests read as a user would:
the status page, the launch page and the certificate's page."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


# Headless Debian chromium as the browser tests run it (the launch page's test too).
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-dev-shm-usage",
)


def chromium_dom(url: str, budget_ms: int = 4000) -> str:
    """The page's DOM after ``budget_ms`` of (virtual) time: its polling script has run."""
    assert CHROMIUM is not None
    out = subprocess.run(
        [
            CHROMIUM,
            *CHROMIUM_FLAGS,
            f"--virtual-time-budget={budget_ms}",
            "--dump-dom",
            url,
        ],
        capture_output=True,
        timeout=90,
        check=True,
    )
    return out.stdout.decode("utf-8", "replace")


def screenshot(url: str, path: Path) -> None:
    """A PNG of the page at ``path``, kept as the test's artifact."""
    assert CHROMIUM is not None
    subprocess.run(
        [CHROMIUM, *CHROMIUM_FLAGS, "--hide-scrollbars", "--window-size=1200,1600",
         f"--screenshot={path}", url],
        capture_output=True,
        timeout=90,
        check=True,
    )  # fmt: skip
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
