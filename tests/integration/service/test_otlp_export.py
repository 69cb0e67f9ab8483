"""OTEL_* configure a real gateway process: OTLP over HTTP to a collector (here a small HTTP
server in the test that decodes the protobuf export), the service name, the parent from an
incoming traceparent, the trace id on the audit record."""

from __future__ import annotations

import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from tests.integration.service.harness import ADMIN, MODEL
from tests.integration.service.process import start_gateway

TRACE = "0af7651916cd43dd8448eb211c80319c"
PARENT = "b7ad6b7169203331"


class Collector(ThreadingHTTPServer):
    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.exports: list[ExportTraceServiceRequest] = []
        self.paths: list[str] = []
        self.got = threading.Event()

    def spans(self) -> list[tuple[str, Any]]:
        """(service name, span) of everything received."""
        out = []
        for export in self.exports:
            for rs in export.resource_spans:
                attrs = {a.key: a.value.string_value for a in rs.resource.attributes}
                for ss in rs.scope_spans:
                    out.extend((attrs.get("service.name", ""), s) for s in ss.spans)
        return out


class _Handler(BaseHTTPRequestHandler):
    server: Collector

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["content-length"]))
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        self.server.paths.append(self.path)
        self.server.exports.append(request)
        self.server.got.set()
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def collector() -> Iterator[Collector]:
    server = Collector()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()


def test_otlp_export_from_a_real_process(
    tiny_manifest: Path, tmp_path: Path, collector: Collector
) -> None:
    env = {
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{collector.server_address[1]}",
        "OTEL_SERVICE_NAME": "gw-test",
        "OTEL_BSP_SCHEDULE_DELAY": "100",
    }
    proc: subprocess.Popen[bytes]
    proc, url, key = start_gateway(tiny_manifest, tmp_path, env_extra=env)
    try:
        headers = {"authorization": f"Bearer {key}", "traceparent": f"00-{TRACE}-{PARENT}-01"}
        body = {"model": MODEL, "prompt": "def add(a, b):", "max_tokens": 4, "temperature": 0}
        r = httpx.post(f"{url}/v1/completions", json=body, headers=headers, timeout=60)
        assert r.status_code == 200 and r.headers["x-trace-id"] == TRACE
        records = httpx.get(f"{url}/audit/records", params={"trace_id": TRACE}, headers=ADMIN)
        assert [x["request_id"] for x in records.json()["data"]] == [r.headers["x-request-id"]]
        for _ in range(100):  # the batch processor exports every 100 ms
            ours = [s for _, s in collector.spans() if s.trace_id.hex() == TRACE]
            if {"gateway.decode", "gateway.audit.write"} <= {s.name for s in ours}:
                break
            collector.got.wait(0.2)
            collector.got.clear()
        else:
            raise AssertionError(f"no complete trace exported: {[s.name for s in ours]}")
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    assert set(collector.paths) == {"/v1/traces"}
    assert {name for name, _ in collector.spans()} == {"gw-test"}
    names = {s.name for s in ours}
    assert {"gateway.auth", "gateway.policy.decide", "gateway.queue", "gateway.prefill"} <= names
    roots = [s for s in ours if s.parent_span_id.hex() == PARENT]
    assert len(roots) == 1 and roots[0].name.startswith("POST")
