"""The request chain: a request planned once, then walked down its precision chain.

* ``planning.py``: one pure function, body + headers + key + route state -> a plan or a 4xx.
* ``routing.py``: one pure function, which precision serves and which runs in shadow.
* ``slices.py``, ``sampling.py``: a request's slice tags and its deterministic sample.
* ``attempts.py``: the one fallback walker (deadline, retry budget, fallback records).
* ``executor.py``: the guards along the chain, the stream's hold-back and forwarding.
* ``completions.py``: ``/v1/completions``, its plan and its fold.

Reads the upstream pools and the guards; never the HTTP surface or the shadow side.
"""
