"""``quantdrift gateway --config gateway.yaml [--port P]``: the reference gateway.

Serves ``/v1/chat/completions`` and ``/v1/models`` (OpenAI-compatible), ``/health``
and ``/metrics`` in front of the precision pools of the config file; Kafka, Redis
and signing keys come from the settings (``QUANTDRIFT_*``, or a running
``quantdrift stack up``). API keys may also come from the environment:
``QUANTDRIFT_GATEWAY__API_KEYS`` holds a JSON list of ``{"name", "sha256",
"routes", "high_precision"}`` entries, added to the config's ``auth.keys`` (so a
secret store can inject them without editing the file). The old name
``QUANTDRIFT_GATEWAY_API_KEYS`` still works, with a warning.

``quantdrift collector`` (``cli/collector.py``) serves the same parts behind a
gateway that mirrors; both start their servers with ``cli/serving.py``.
"""

from __future__ import annotations

import argparse

from quantdrift.cli.serving import serve
from quantdrift.gateway.http.app import create_app


def run(args: argparse.Namespace) -> int:
    return serve(args, create_app)
