"""Test tiers, marked by folder here and nowhere else.

``make test-fast`` runs ``-m "(unit or pure) and not slow and not long"``: the unit folder (which
also holds every module's doctests) and the contract checks that need no server.
``make test`` runs every tier. A contract test that needs a real server (Redis) is
marked ``integration`` as well, so the fast tier leaves it out: the breaker-store
contract is split per store.

What the tests share (the stack, a Redis store, worker processes, the scripted
upstreams, ``ask``) is the ``support`` package beside this file, registered here as
a plugin; ``pyproject.toml`` puts ``tests/`` on pytest's ``pythonpath`` for it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["support.plugin"]

TESTS = Path(__file__).resolve().parent

# A fault test runs real servers too, so it is an integration test as well.
FOLDER_MARKERS: dict[str, tuple[str, ...]] = {
    "unit": ("unit",),
    "contract": ("contract",),
    "integration": ("integration",),
    "faults": ("faults", "integration"),
    "vllm": ("vllm",),
}

# The breaker-store contract runs each check on memory and on Redis: only its Redis
# half is a server test (see ``_needs_server``). The gateway's OpenAI SDK contract runs
# the gateway in this process over the in-memory scripted upstream: no server.
CONTRACT_SERVER_PARAMS = {"test_breaker_store.py": "redis"}


def _needs_server(item: pytest.Item, path: Path) -> bool:
    param = CONTRACT_SERVER_PARAMS.get(path.name)
    callspec = getattr(item, "callspec", None)
    return param is not None and callspec is not None and param in callspec.params.values()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Add the folder's tier marker to every test collected under ``tests/``."""
    for item in items:
        path = Path(str(item.path)).resolve()
        try:
            folder = path.relative_to(TESTS).parts[0]
        except (ValueError, IndexError):
            continue
        for marker in FOLDER_MARKERS.get(folder, ()):
            item.add_marker(marker)
        if folder == "contract":
            item.add_marker("integration" if _needs_server(item, path) else "pure")
