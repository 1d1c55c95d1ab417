"""``quantdrift collector --config gateway.yaml [--port P]``: pairs behind any mirroring gateway.

nginx (``mirror``), Envoy (``request_mirror_policies``) or a Gateway API route
(``RequestMirror``) copies a share of its users' chat requests here; the collector
answers 202 at once and, for its sampled share, asks the config's candidate and
reference itself and publishes the pairs the gateway would (docs/collector.md).
Same config file, settings and options as ``quantdrift gateway``; the config's
``collector.mirrored_share`` says what share the gateway in front mirrors.
"""

from __future__ import annotations

import argparse

from quantdrift.cli.serving import serve
from quantdrift.gateway.foreign.collector import create_collector_app


def run(args: argparse.Namespace) -> int:
    return serve(args, create_collector_app, collector=True)
