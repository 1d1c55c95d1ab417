"""The consumer commands' shared flags: group and stop rules, read back as the loop's keywords."""

from __future__ import annotations

import argparse
import inspect
from types import SimpleNamespace
from typing import Any

import pytest

from quantdrift.alerts.forward import run_forward
from quantdrift.cli.common import consumer_loop_options
from quantdrift.cli.parsers.alerts import register as register_alerts
from quantdrift.cli.parsers.archive import register as register_archive
from quantdrift.replay.archive import run_archive

SETTINGS: Any = SimpleNamespace(worker=SimpleNamespace(app_id="qd"))


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="quantdrift")
    sub = parser.add_subparsers(dest="command")
    register_alerts(sub)
    register_archive(sub)
    return parser.parse_args(argv)


ALERTS = ["alerts", "forward", "--alertmanager", "http://am"]
ARCHIVE = ["archive", "--dir", "out"]


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (ALERTS, {"group_id": "qd-alerts", "max_alerts": None, "idle_exit_s": None}),
        (ARCHIVE, {"group_id": "qd-archive", "max_records": None, "idle_exit_s": None}),
        (
            [*ALERTS, "--group", "pager", "--max-alerts", "3", "--idle-exit-s", "2.5"],
            {"group_id": "pager", "max_alerts": 3, "idle_exit_s": 2.5},
        ),
        (
            [*ARCHIVE, "--max-records", "10", "--idle-exit", "4"],  # the old unitless flag
            {"group_id": "qd-archive", "max_records": 10, "idle_exit_s": 4.0},
        ),
    ],
)
def test_flags_become_the_loop_keywords(argv: list[str], expected: dict[str, Any]) -> None:
    assert consumer_loop_options(parse(argv), SETTINGS) == expected


@pytest.mark.parametrize(("argv", "loop"), [(ALERTS, run_forward), (ARCHIVE, run_archive)])
def test_every_keyword_is_one_the_loop_takes(argv: list[str], loop: Any) -> None:
    params = inspect.signature(loop).parameters
    for name in consumer_loop_options(parse(argv), SETTINGS):
        assert params[name].kind is inspect.Parameter.KEYWORD_ONLY
