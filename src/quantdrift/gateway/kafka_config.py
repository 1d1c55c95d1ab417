"""The Kafka client settings moved to ``quantdrift.kafka_clients`` (shared with the worker).

Re-exported here so code written against the old path keeps importing; new code
imports ``quantdrift.kafka_clients``.
"""

from quantdrift.kafka_clients import consumer_kwargs, producer_kwargs

__all__ = ["consumer_kwargs", "producer_kwargs"]
