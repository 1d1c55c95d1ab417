"""The upstream: model servers, one pool per precision.

* ``pools.py``: one client and connection limit per pool, streaming calls, failures told apart.
* ``client.py``: the client to model servers, a bounded wait for a connection.
* ``engines.py``: what engine serves a pool.
* ``teacher_forcing.py``: the reference's log-prob of each token the candidate wrote.

Reads the guards (outlier ejection, the loop's lag); nothing above it.
"""
