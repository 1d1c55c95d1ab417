"""The guards: small objects with readable state that refuse, shed or cut.

* ``auth.py``: API keys, routes and privileges per key.
* ``overload.py``: the gateway's own event-loop lag, shedding at the door.
* ``capacity.py``: the retry budget and outlier ejection (time passed in).
* ``json_guard.py`` (its token scanner in ``json_tokens.py``), ``degeneration.py``:
  the streaming guards.

The bottom room of the serving side: it reads the gateway's config and nothing else of it.
"""
