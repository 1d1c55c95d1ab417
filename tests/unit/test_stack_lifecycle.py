"""The stack's one stop path: what a server handle removes, what it leaves, and ``with``."""

from __future__ import annotations

import atexit
from pathlib import Path
from typing import Any, Self

import pytest

from quantdrift.stack.broker import TansuBroker
from quantdrift.stack.lifecycle import Managed, ServerProcess
from quantdrift.stack.redis_server import LocalRedis


class FakeChild:
    """Enough of ``Popen`` for ``stop_popen``: runs until terminated."""

    def __init__(self) -> None:
        self.returncode: int | None = None
        self.terminated = 0

    def poll(self) -> int | None:
        return self.returncode

    def terminate(self) -> None:
        self.terminated += 1
        self.returncode = -15

    def wait(self, timeout: float | None = None) -> int:
        assert self.returncode is not None
        return self.returncode


class Server(ServerProcess):
    def __init__(self, child: FakeChild | None, scratch: Path | None) -> None:
        self._proc: Any = child
        self._scratch = scratch
        self.started = 0

    def start(self) -> Self:
        self.started += 1
        atexit.register(self.stop)
        return self


def test_stop_ends_the_child_and_removes_the_scratch_folder_once(tmp_path: Path) -> None:
    scratch = tmp_path / "quantdrift-x"
    scratch.mkdir()
    (scratch / "server.log").write_text("log")
    child = FakeChild()
    server = Server(child, scratch).start()
    server.stop()
    assert child.terminated == 1 and not scratch.exists()
    server.stop()  # twice is safe: nothing left to stop
    assert child.terminated == 1


def test_stop_unregisters_its_exit_hook(monkeypatch: Any) -> None:
    forgotten: list[object] = []
    monkeypatch.setattr(atexit, "unregister", forgotten.append)
    server = Server(FakeChild(), None)
    server.stop()
    assert forgotten == [server.stop]


def test_a_log_folder_the_caller_gave_is_never_removed(tmp_path: Path) -> None:
    broker = TansuBroker(log_dir=tmp_path)
    assert broker.log_dir == tmp_path
    broker.stop()
    assert tmp_path.exists() and broker.log_dir == tmp_path


def test_with_starts_then_stops(tmp_path: Path) -> None:
    child = FakeChild()
    with Server(child, None) as server:
        assert server.started == 1 and child.terminated == 0
    assert child.terminated == 1


def test_managed_needs_a_start() -> None:
    class Nothing(Managed):
        pass

    with pytest.raises(NotImplementedError), Nothing():
        raise AssertionError("entered a handle that cannot start")


def test_local_redis_found_is_not_ours_and_stop_is_a_no_op() -> None:
    with LocalRedis("redis://127.0.0.1:1") as found:
        assert not found.started_by_us and found.data_dir is None
    assert found.pid is None


def test_local_redis_removes_only_the_data_dir_it_was_given(tmp_path: Path) -> None:
    data = tmp_path / "quantdrift-redis-1"
    data.mkdir()
    child: Any = FakeChild()
    child.pid = 999_999_999  # no such process: its start token is None
    redis = LocalRedis("redis://127.0.0.1:1", proc=child, data_dir=data)
    assert redis.started_by_us and redis.data_dir == data
    redis.stop()
    assert child.terminated == 1 and not data.exists() and redis.data_dir is None
