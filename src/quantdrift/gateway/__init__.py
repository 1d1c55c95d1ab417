"""The gateway side of the guard loop: mirror pairs out, obey commands in.

* ``ShadowPublisher``: deterministic sampling and a non-blocking, bounded produce path
  (``producer.BoundedProducer``).
* ``RouteController`` (``control/``): follows signed RouteCommands on the control topic,
  with the route's Redis key as a backstop.
"""

from quantdrift.gateway.control.controller import (
    AppliedCommand,
    ControllerStats,
    RouteController,
    command_key,
)
from quantdrift.gateway.producer import PublisherStats
from quantdrift.gateway.publisher import ShadowPublisher
from quantdrift.gateway.sampling import bucket, sampled
from quantdrift.kafka_clients import consumer_kwargs, producer_kwargs

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
