"""What the command line shares with other packages: composition, not decisions.

* :mod:`~quantdrift.services.console`: the one-click console's manual step
  (status, rollback, restore, release) and the outbox publish after it, used by
  ``quantdrift route`` and preflight's switch drill.
* :mod:`~quantdrift.services.gateway`: builds the gateway from its config and settings.
* :mod:`~quantdrift.services.scoring`: builds the scorer every scoring caller uses.
* :mod:`~quantdrift.services.worker`: one worker process: the stages, the Redis store
  and the status page beside them.

A service may import any package below it; no package below imports a service
(preflight is handed the console and the scorer it runs: ``services.preflight``),
and the CLI only parses, calls a service and prints.
"""
