"""Headless Chromium (Debian's package) for the pages the tests read as a user would."""

from __future__ import annotations

import shutil
import subprocess

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
