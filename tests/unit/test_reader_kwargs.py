"""A reader of recorded topics starts at the earliest offset and never commits on its own."""

from __future__ import annotations

import pytest
from aiokafka import AIOKafkaConsumer

from quantdrift.config import KafkaSettings
from quantdrift.kafka_clients import consumer_kwargs, reader_kwargs


@pytest.mark.parametrize("group_id", [None, "qd-alerts"])
def test_reader_adds_its_group_settings_and_keeps_the_rest(group_id: str | None) -> None:
    base = consumer_kwargs(KafkaSettings(bootstrap_servers="kafka:9092"))
    options = reader_kwargs(base, group_id)
    assert options == {
        **base,
        "group_id": group_id,
        "enable_auto_commit": False,
        "auto_offset_reset": "earliest",
    }
    assert "group_id" not in base  # the caller's options are not changed


def test_the_group_settings_win_over_the_callers() -> None:
    options = reader_kwargs({"enable_auto_commit": True, "group_id": "x"}, None)
    assert options["enable_auto_commit"] is False and options["group_id"] is None


async def test_aiokafka_takes_them() -> None:
    base = consumer_kwargs(KafkaSettings(bootstrap_servers="127.0.0.1:1"))
    consumer = AIOKafkaConsumer(**reader_kwargs(base, "g"))  # built, never started
    assert consumer._group_id == "g" and consumer._enable_auto_commit is False
