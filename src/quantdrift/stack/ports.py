"""Free loopback ports and the few process facts the stack needs.

The process helpers live here (not in ``broker`` or ``redis_server``) because
both servers, and ``stack down`` in a later process, must agree on what
"the process we started" means: same pid *and* same start time, so a pid the
kernel has reused for some other program is never killed.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from pathlib import Path


def free_port(host: str = "127.0.0.1") -> int:
    """Ask the kernel for a free TCP port on ``host``.

    There is a small race (the port is free when we close our socket, someone
    else may take it before the server binds), so callers retry on a failed
    start instead of trusting this blindly.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def tail(path: Path | str, max_bytes: int = 4000) -> str:
    """Last ``max_bytes`` of a log file, for error messages; '' if unreadable."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - max_bytes))
            return fh.read().decode("utf-8", "replace").strip()
    except OSError:
        return ""


def process_start_token(pid: int) -> str | None:
    """A string that identifies one process for its whole life, or None if gone.

    Linux: field 22 of /proc/PID/stat (start time in clock ticks since boot).
    Elsewhere: ``ps -o lstart=``. A pid with another token is another process.
    """
    if Path("/proc/self/stat").exists():
        try:
            raw = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return None
        # The command name (field 2) may contain spaces; fields after ')' are fixed.
        fields = raw.rsplit(")", 1)[1].split()
        if fields[0] == "Z":  # a zombie has finished; only its exit status is left
            return None
        return fields[19]
    try:
        out = subprocess.run(
            ["ps", "-o", "lstart=", "-p", str(pid)],
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None


def pid_alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie counts as dead); reaps our own zombies."""
    with contextlib.suppress(ChildProcessError, OSError):
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return process_start_token(pid) is not None


def is_same_process(pid: int, start_token: str | None, program: str | None) -> bool:
    """True if ``pid`` still is the process we started: same start time and executable.

    The executable is read from /proc/PID/exe rather than the command line,
    because redis-server rewrites its command line into a process title.
    Without /proc only the start time can be checked.
    """
    if not pid_alive(pid):
        return False
    if start_token is not None and process_start_token(pid) != start_token:
        return False
    try:
        exe: str | None = os.readlink(f"/proc/{pid}/exe").removesuffix(" (deleted)")
    except OSError:
        exe = None
    if exe is not None and program and os.path.realpath(exe) != os.path.realpath(program):
        return False
    return start_token is not None or exe is not None


def stop_pid(pid: int, start_token: str | None, timeout: float = 5.0) -> bool:
    """SIGTERM then SIGKILL ``pid``, only if it is still the process we started.

    Returns True if the process is gone afterwards (or already was), False if
    the pid now belongs to another process and was left alone.
    """
    if not pid_alive(pid):
        return True
    if start_token is not None and process_start_token(pid) != start_token:
        return False
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 2.0)):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if not pid_alive(pid):
                return True
            time.sleep(0.05)
    return not pid_alive(pid)


def stop_popen(proc: subprocess.Popen[bytes], timeout: float = 5.0) -> None:
    """Terminate a child we hold, kill it after ``timeout``, and reap it."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=5.0)


def abandon_start(
    proc: subprocess.Popen[bytes], what: str, waited_for: str, timeout_s: float, log: Path | str
) -> str:
    """Stop a server that did not come up, and say why in one message with its log tail."""
    exited = proc.poll() is not None
    stop_popen(proc, timeout=2.0)
    why = (
        f"exited with status {proc.returncode}"
        if exited
        else f"did not answer {waited_for} within {timeout_s:.0f}s"
    )
    return f"{what} {why}; log tail:\n{tail(log)}"
