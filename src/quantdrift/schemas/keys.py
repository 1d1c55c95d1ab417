"""The Redis key layout, in one place: a wire contract between the breaker and gateways.

Every key of a route carries the route in a hash tag (``{route}``), so the
breaker's one Lua step touches a single slot and runs on Redis Cluster. A
gateway in another language reads ``route_key(prefix, route, "command")``.

  {prefix}route:{R}:state           hash  v = version, s = RouteState JSON
  {prefix}route:{R}:command         str   the latest SignedCommand envelope
  {prefix}route:{R}:outbox          list  commands and alerts still to publish
  {prefix}route:{R}:outbox:owner    str   the claim token of the publishing worker
  {prefix}route:{R}:seen:KIND:ID    str   dedupe of pair ids (TTL)
  {prefix}route:{R}:noise:MODE      hash  noise floor per decoding mode (gateways read
                                          its size to fill it: ``noise_key``)
  {prefix}route:{R}:audit           stream  verdict API: webhook answers and Flagger events
  {prefix}route:{R}:spend:GW        str   one gateway's shadow spend and share on the route
                                          (JSON, TTL: gone with the gateway; ``spend_key``)
  {prefix}route:{R}:spenders        zset  the gateways that report there, scored by when
                                          they last did (each prunes the silent ones)
  {prefix}routes                    set   every route seen (outside any Lua step)
  {prefix}breaker:alive             str   set by a worker once the routes' states are known;
                                          absent: a first start, or a Redis that lost its
                                          data (states are then rebuilt: breaker/reseed.py)
"""

from __future__ import annotations


def route_key(prefix: str, route: str, what: str) -> str:
    """``qd:route:{cs-agent/int4}:state`` for prefix ``qd:``.

    >>> route_key("qd:", "cs-agent/int4", "command")
    'qd:route:{cs-agent/int4}:command'
    """
    return f"{prefix}route:{{{route}}}:{what}"


def command_key(prefix: str, route: str) -> str:
    """Where a route's latest signed command lives (gateways poll it)."""
    return route_key(prefix, route, "command")


def noise_key(prefix: str, route: str, mode: str) -> str:
    """A route's noise floor for one decoding mode: hash ``v`` (version), ``s`` (JSON:
    metric -> the floor's values, as ``NoiseFloorState.to_json`` writes it)."""
    return route_key(prefix, route, f"noise:{mode}")


def spend_key(prefix: str, route: str, gateway: str) -> str:
    """One gateway's report of what shadowing ``route`` spent on its upstreams and its share
    now (``gateway/control/spend_report.py`` writes it, the worker's status page sums it).

    >>> spend_key("qd:", "cs-agent/int4", "gw-1")
    'qd:route:{cs-agent/int4}:spend:gw-1'
    """
    return route_key(prefix, route, f"spend:{gateway}")


def spenders_key(prefix: str, route: str) -> str:
    """The gateways reporting spend on ``route``: a sorted set, member the gateway, score
    the time of its last report; a reader takes the members and reads their ``spend_key``."""
    return route_key(prefix, route, "spenders")


def routes_key(prefix: str) -> str:
    return f"{prefix}routes"


def alive_key(prefix: str) -> str:
    """Present while Redis still holds what the breaker wrote (``breaker/reseed.py``)."""
    return f"{prefix}breaker:alive"


COMMAND_KEY_GLOB = "route:{*}:command"


def route_of_command_key(prefix: str, key: str) -> str | None:
    """The route named by a command key, or None if ``key`` is not one.

    >>> route_of_command_key("qd:", "qd:route:{a/b}:command")
    'a/b'
    """
    head, tail = f"{prefix}route:{{", "}:command"
    if key.startswith(head) and key.endswith(tail) and len(key) > len(head) + len(tail):
        return key[len(head) : -len(tail)]
    return None
