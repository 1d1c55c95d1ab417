"""How the stack's handles start and stop: ``with`` on any of them, and one stop path.

The broker, a Redis and the whole stack are context managers alike (enter starts,
exit stops). The broker and a Redis we started each hold at most one child
process and one scratch folder of ours (Tansu's log, Redis's data dir), and they
must stop alike: forget the atexit hook first, so a handle stopped by hand is not
stopped again at exit; stop the child (SIGTERM, SIGKILL after a timeout); remove
only the folder we made, never one the caller gave. One base holds that path, so
the two servers cannot drift apart.
"""

from __future__ import annotations

import atexit
import contextlib
import shutil
import subprocess
from pathlib import Path
from types import TracebackType
from typing import Self

from quantdrift.stack.ports import stop_popen


class Managed:
    """A handle that ``with`` starts and stops; subclasses say what starting means."""

    def start(self) -> Self:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


class ServerProcess(Managed):
    """A server we may have started: its child process and scratch folder, stopped as one.

    ``_proc`` is the child (None for a server we merely found, or once stopped);
    ``_scratch`` a temp folder this handle made (None when the caller gave one).
    """

    _proc: subprocess.Popen[bytes] | None = None
    _scratch: Path | None = None

    def stop(self, timeout: float = 5.0) -> None:
        """Stop our server (SIGTERM, SIGKILL after ``timeout``) and remove our scratch
        folder; a server we did not start is left alone. Safe to call twice."""
        with contextlib.suppress(Exception):
            atexit.unregister(self.stop)
        if self._proc is not None:
            stop_popen(self._proc, timeout=timeout)
            self._proc = None
        self._remove_scratch()

    def _remove_scratch(self) -> None:
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)
            self._scratch = None
