"""The guard inside stacks users already run.

* ``verdict`` / ``verdict_api``: a route's verdict for rollout controllers (Argo
  Rollouts' ``web`` metric provider, Flagger's webhooks), read from the breaker's
  Redis state, never written.
* ``otel``: OpenTelemetry evaluation events and GenAI spans, off unless configured.

Nothing in the core packages imports this one; only the command line does.
"""
