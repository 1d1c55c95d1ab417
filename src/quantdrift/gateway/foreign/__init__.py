"""Gateways quantdrift does not own: the collector and the follower.

* ``collector.py``: mirrored requests (nginx, Envoy, Gateway API) become the same pairs.
* ``follower.py``: signed RouteCommands applied to nginx's upstream file.

Built from the gateway's own parts, so it sits above every other room.
"""
