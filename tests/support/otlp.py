"""A receiver that speaks the OpenTelemetry collector's OTLP/HTTP protocol, for the tests
that check what a real process exports (the worker's, the console's, a certificate's events).

``receiver`` (a fixture, registered by ``support.plugin``) decodes every protobuf export
request it gets on ``/v1/logs`` and ``/v1/traces``.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
    ExportLogsServiceRequest,
    ExportLogsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from quantdrift.stack import free_port


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    return getattr(v, kind) if kind else None


@dataclass
class Receiver:
    url: str
    logs: list[dict[str, Any]] = field(default_factory=list)
    spans: list[dict[str, Any]] = field(default_factory=list)
    requests: int = 0

    def events(self, name: str) -> list[dict[str, Any]]:
        return [r for r in list(self.logs) if r["event_name"] == name]


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    """Speaks the collector's OTLP/HTTP protocol (protobuf): /v1/logs and /v1/traces."""
    port = free_port()
    got = Receiver(f"http://127.0.0.1:{port}")

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length", 0)))
            got.requests += 1
            if self.path == "/v1/logs":
                req = ExportLogsServiceRequest.FromString(body)
                for rl in req.resource_logs:
                    service = {a.key: _value(a.value) for a in rl.resource.attributes}
                    for sl in rl.scope_logs:
                        for rec in sl.log_records:
                            got.logs.append(
                                {
                                    "event_name": rec.event_name,
                                    "attributes": {a.key: _value(a.value) for a in rec.attributes},
                                    "body": _value(rec.body) if rec.HasField("body") else None,
                                    "resource": service,
                                    "scope": sl.scope.name,
                                }
                            )
                answer = ExportLogsServiceResponse().SerializeToString()
            elif self.path == "/v1/traces":
                treq = ExportTraceServiceRequest.FromString(body)
                for rs in treq.resource_spans:
                    for ss in rs.scope_spans:
                        got.spans.extend({"name": s.name} for s in ss.spans)
                answer = ExportTraceServiceResponse().SerializeToString()
            else:
                self.send_response(404)
                self.end_headers()
                return
            self.send_response(200)
            self.send_header("content-type", "application/x-protobuf")
            self.send_header("content-length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *_: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield got
    server.shutdown()
    thread.join(5)
