"""Progress bars: one look on stderr for both kinds, and silence off a terminal."""

from __future__ import annotations

import io
import sys
from typing import Any

import pytest

from quantdrift.cli import progress


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_off_a_terminal_there_is_no_bar(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    with progress.progress_bar() as update:
        update(desc="x", total=3, advance=1)  # a no-op, not an error
    assert progress.self_closing(True, "x") is None
    assert progress.self_closing(False, "x") is None


def test_the_bar_is_transient_and_on_stderr() -> None:
    bar = progress._stderr_bar()
    assert bar.live.transient
    assert bar.console.stderr
    assert len(bar.columns) == 4


def test_both_kinds_share_the_one_bar(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "stderr", Tty())
    made: list[Any] = []
    real = progress._stderr_bar

    def spy() -> Any:
        made.append(real())
        return made[-1]

    monkeypatch.setattr(progress, "_stderr_bar", spy)
    with progress.progress_bar(default_desc="scoring") as update:
        update(total=4)
        update(advance=3)
    assert [t.completed for t in made[0].tasks] == [3]
    closing = progress.self_closing(True, "caching")
    assert closing is not None
    closing(total=2)
    closing(advance=2)
    assert len(made) == 2 and made[1].tasks[0].finished
