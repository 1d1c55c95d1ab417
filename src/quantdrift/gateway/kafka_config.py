"""Kept so existing imports keep working: the Kafka client settings live in
``quantdrift.kafka_clients``, below both the gateway and the worker."""

from quantdrift.kafka_clients import consumer_kwargs, producer_kwargs, start_client

__all__ = ["consumer_kwargs", "producer_kwargs", "start_client"]
