"""What the tests share, as one package: ``tests/conftest.py`` registers :mod:`support.plugin`.

* :mod:`support.plugin`: the fixtures every tier may ask for: ``stack`` (the embedded
  broker and a Redis, once per session), ``redis_prefix`` (a key prefix cleaned up
  after the test), ``redis_store`` (a Redis breaker store under it),
  ``kafka_consume``, ``worker_process`` (a factory whose workers stop at teardown),
  ``scripted_llm`` (the scripted OpenAI-compatible upstream).
* :mod:`support.workers`: the one place a ``quantdrift worker`` child is built.
* :mod:`support.kafka`: unique topics, produce, consume with a deadline.
* :mod:`support.guard`: isolated settings, sending pairs, reading what the judge folded.
* :mod:`support.scripted_llm`: the scripted upstream; :mod:`support.gateway_upstream`:
  the gateway tests' upstream with a behaviour per path, and their request helpers.
* :mod:`support.rollback`: child processes, the control-topic watch and ``ask`` for
  the tests that drive a real gateway end to end.
* :mod:`support.faults`, :mod:`support.transitions`, :mod:`support.scoring_split`:
  what the fault tests add (a restartable Redis, failpoint workers, several scorers).
* the multi-host rig: :mod:`support.netrig` (namespaces, partitions, loss),
  :mod:`support.delay_proxy`, :mod:`support.rig_stack` (the parts on their hosts, the
  SDK load), :mod:`support.fault_cases` and :mod:`support.fault_run` (the fault
  schedule), :mod:`support.fault_oracle` (the end-of-run checker).

``pyproject.toml`` puts ``tests/`` (and ``bench/``, for the benchmarks' own tests) on
pytest's ``pythonpath``: no test edits ``sys.path``, and no test imports another test
module.
"""
