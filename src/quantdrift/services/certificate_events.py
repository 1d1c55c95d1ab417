"""A certificate as OpenTelemetry evaluation events: checked first, exported only if it holds.

``quantdrift preflight certificate-events CERT`` calls :func:`certificate_events`. A
certificate that does not verify is refused here (``SignatureError``, one CLI line),
never exported: a backend that reads these events would take a forged one's
evidence for the build's. The events go out the same way as the worker's
(``quantdrift.otel``: the OTel environment, OTLP/HTTP), or are returned for
``--json`` without a collector.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from quantdrift import otel
from quantdrift.errors import ConfigError, SignatureError
from quantdrift.schemas.certificate import check_file


def certificate_events(
    path: Path, signing: Any, public_keys: Sequence[Path] = (), export: bool = True
) -> list[dict[str, Any]]:
    """The certificate's events (attributes), exported over OTLP when ``export``."""
    result = check_file(path, signing, public_keys)
    if not result.ok or result.payload is None:
        raise SignatureError(f"{path.name} does not verify: {'; '.join(result.problems)}")
    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    rows = otel.certificate_attributes(result.payload, result.key_id, result.signers, sha)
    if export:
        telemetry = otel.current()
        if telemetry is None:
            raise ConfigError(
                "no OpenTelemetry export: set OTEL_EXPORTER_OTLP_ENDPOINT (or print with --json)"
            )
        telemetry.certificate(rows)
        telemetry.flush()
    return rows
