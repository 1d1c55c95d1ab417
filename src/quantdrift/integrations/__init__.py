"""The guard inside stacks users already run.

* ``verdict`` / ``verdict_api``: a route's verdict for rollout controllers (Argo
  Rollouts' ``web`` metric provider, Flagger's webhooks), read from the breaker's
  Redis state, never written.
* OpenTelemetry's evaluation events and GenAI spans are a leaf of their own,
  ``quantdrift.otel``, since the worker and the gateway call its hooks.

Nothing in the core packages imports this one; only the command line does.
"""
