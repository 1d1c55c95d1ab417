"""The gateway's HTTP surface: what a client meets, and the service it is served from.

* ``app.py``: the FastAPI apps (routes, lifespan); ``endpoints.py``: the request flows.
* ``edge.py``: one request's bounded body, client disconnects, headers.
* ``openai_errors.py``: every error a client sees, in OpenAI's shape.
* ``observability.py``: ``/health``, live metrics, per-answer timings.
* ``lingering.py``: the lingering close, so an early answer is read.
* ``service.py``: ``Gateway``, the parts every request shares, composed once.

The top room of the serving side: it may read every room below it.
"""
