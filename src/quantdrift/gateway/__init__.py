"""The gateway side of the guard loop: mirror pairs out, obey commands in.

* ``ShadowPublisher``: deterministic sampling and a non-blocking, bounded produce path
  (``producer.BoundedProducer``).
* ``RouteController`` (``control/``): follows signed RouteCommands on the control topic,
  with the route's Redis key as a backstop.

A lazy face (PEP 562): ``from quantdrift.gateway import RouteController`` works, but
importing any one gateway module (the planner, the wire format, teacher forcing) no longer
loads the controller, the publisher and the Kafka client with it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from quantdrift.gateway.chain.sampling import bucket, sampled
    from quantdrift.gateway.control.controller import (
        AppliedCommand,
        ControllerStats,
        RouteController,
        command_key,
    )
    from quantdrift.gateway.shadow.producer import PublisherStats
    from quantdrift.gateway.shadow.publisher import ShadowPublisher
    from quantdrift.kafka_clients import consumer_kwargs, producer_kwargs

# name -> the module that holds it
_FACE = {
    "AppliedCommand": "quantdrift.gateway.control.controller",
    "ControllerStats": "quantdrift.gateway.control.controller",
    "RouteController": "quantdrift.gateway.control.controller",
    "command_key": "quantdrift.gateway.control.controller",
    "PublisherStats": "quantdrift.gateway.shadow.producer",
    "ShadowPublisher": "quantdrift.gateway.shadow.publisher",
    "bucket": "quantdrift.gateway.chain.sampling",
    "sampled": "quantdrift.gateway.chain.sampling",
    "consumer_kwargs": "quantdrift.kafka_clients",
    "producer_kwargs": "quantdrift.kafka_clients",
}

__all__ = [
    "AppliedCommand",
    "ControllerStats",
    "PublisherStats",
    "RouteController",
    "ShadowPublisher",
    "bucket",
    "command_key",
    "consumer_kwargs",
    "producer_kwargs",
    "sampled",
]


def __getattr__(name: str) -> Any:
    module = _FACE.get(name)
    if module is None:
        raise AttributeError(f"module 'quantdrift.gateway' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
