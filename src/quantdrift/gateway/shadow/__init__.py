"""The shadow side: sampled requests mirrored to the other side, pairs out to Kafka.

* ``runner.py``: ``ShadowRunner``, isolated from users (own clients, bounded queue).
* ``publisher.py``: what goes out (sampled pairs, degradation events), each with its encoder.
* ``producer.py``: one bounded producer, every drop counted by reason.

Reads the request chain (the plan, the routing decision) and the upstream pools.
"""
