"""The gateway's control side: what decides where a route's users go, apart from serving them.

* ``controller.py``: ``RouteController`` follows signed RouteCommands (control
  topic, Redis key as backstop: ``followers.py``), gates each through the pure
  ``fence.py`` and keeps one ``AppliedCommand`` per route, slices held apart included.
* ``targets.py``: a command's target role mapped onto this gateway's pools.
* ``preflight_gate.py``: a route's candidate capped until its preflight report verifies.

Serving reads control through narrow values (``routing.RouteDirective``, a cap
per route) and control imports nothing of serving but the gateway's config, so
either side can change without the other.
"""
