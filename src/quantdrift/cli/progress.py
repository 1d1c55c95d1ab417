"""Progress on stderr for commands that can run for minutes, silent when not a terminal.

stdout holds the result (one JSON document with ``--json``), so progress never
goes there; and a log file or a pipe gets no bar redrawn a thousand times.
"""

from __future__ import annotations

import atexit
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from rich.progress import Progress


class Update(Protocol):
    def __call__(self, *, desc: str = ..., total: int | None = ..., advance: int = ...) -> None:
        """Create the task ``desc`` (with ``total`` when known), or move it on."""


def enabled(flag: bool = True) -> bool:
    """Show progress: the command allows it and stderr is a terminal."""
    return flag and sys.stderr.isatty()


def _stderr_bar() -> Progress:
    """The one look of every bar: description, bar, done/total, time left; on stderr,
    gone when finished (stdout holds the result)."""
    # Deferred: rich's progress machinery is only needed on a terminal.
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

    return Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        console=Console(stderr=True),
        transient=True,
    )


@contextmanager
def progress_bar(flag: bool = True, default_desc: str = "work") -> Iterator[Update]:
    """A rich progress bar on stderr; a no-op callable when disabled or not a terminal."""
    if not enabled(flag):

        def noop(**_: Any) -> None:
            return None

        yield noop
        return
    with _stderr_bar() as bar:
        tasks: dict[str, Any] = {}

        def update(*, desc: str = default_desc, total: int | None = None, advance: int = 0) -> None:
            if desc not in tasks:
                tasks[desc] = bar.add_task(desc, total=total)
            elif total is not None:
                bar.update(tasks[desc], total=total)
            if advance:
                bar.advance(tasks[desc], advance)

        yield update


def self_closing(flag: bool, desc: str) -> Update | None:
    """A bar for code that reports ``total=`` then ``advance=`` (e.g. ``ScoreCache``),
    shown from the first total and closed when the work is done: no ``with`` block
    has to wrap the command. None when disabled or not a terminal.
    """
    if not enabled(flag):
        return None
    bar = _stderr_bar()
    state: dict[str, Any] = {"task": None, "left": 0}
    atexit.register(bar.stop)  # a failure mid-way still gives the terminal back

    def update(*, desc: str = desc, total: int | None = None, advance: int = 0) -> None:
        if total is not None:
            if state["task"] is None:
                bar.start()
                state["task"] = bar.add_task(desc, total=total)
            else:
                bar.reset(state["task"], total=total, visible=True)
                bar.start()
            state["left"] = total
        if advance and state["task"] is not None:
            bar.advance(state["task"], advance)
            state["left"] -= advance
            if state["left"] <= 0:
                bar.stop()

    return update
