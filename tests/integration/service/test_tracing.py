"""Per-request traces with an in-memory span exporter: one trace per request with the
auth, decision, queue, prefill, decode and audit-write spans and their attributes, parented
on an incoming traceparent, its id on the audit record and in the x-trace-id header; none
of the request's text in any span; and nothing at all with tracing off."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from gateway.serving.tracing import TracingConfigError, provider_from_env
from tests.integration.service.harness import ADMIN, sqlite_gateway

PROMPT = "def secret_prompt_words(a, b):"
PARENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_SPAN = "00f067aa0ba902b7"


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


def _provider(exporter: InMemorySpanExporter) -> TracerProvider:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider


def _by_name(spans: list[ReadableSpan], trace_id: int) -> dict[str, list[ReadableSpan]]:
    out: dict[str, list[ReadableSpan]] = {}
    for s in spans:
        if s.context.trace_id == trace_id:
            out.setdefault(s.name, []).append(s)
    return out


def _text_in_spans(spans: list[ReadableSpan], text: str) -> list[str]:
    found = []
    for s in spans:
        for key, value in (s.attributes or {}).items():
            if text in str(value):
                found.append(f"{s.name}.{key}")
        for event in s.events:
            if text in str(event.attributes):
                found.append(f"{s.name} event {event.name}")
    return found


async def test_one_trace_per_request_with_its_spans(
    tiny_manifest: Path, tmp_path: Path, exporter: InMemorySpanExporter
) -> None:
    async with sqlite_gateway(tiny_manifest, tmp_path, tracer_provider=_provider(exporter)) as gw:
        exporter.clear()
        headers = {**gw.auth, "traceparent": f"00-{PARENT_TRACE}-{PARENT_SPAN}-01"}
        body = {
            "model": "tiny-target", "prompt": PROMPT, "max_tokens": 24, "temperature": 0,
            "decoding": {"mode": "speculative", "proposer": "draft", "k": 3},
        }  # fmt: skip
        r = await gw.client.post("/v1/completions", json=body, headers=headers)
        assert r.status_code == 200, r.text
        assert r.headers["x-trace-id"] == PARENT_TRACE
        text = r.json()["choices"][0]["text"]
        records = await gw.records(trace_id=PARENT_TRACE)
        assert len(records) == 1 and records[0]["request_id"] == r.headers["x-request-id"]
        record = records[0]
        assert record["trace_id"] == PARENT_TRACE
        # a second request without traceparent: a trace of its own
        r2 = await gw.complete(max_tokens=4, temperature=0)
        assert r2.status_code == 200
        second = r2.headers["x-trace-id"]
        assert second != PARENT_TRACE and len(second) == 32
        assert [x["request_id"] for x in await gw.records(trace_id=second)] == [
            r2.headers["x-request-id"]
        ]

    spans = exporter.get_finished_spans()
    names = _by_name(list(spans), int(PARENT_TRACE, 16))
    for name in ("gateway.auth", "gateway.policy.decide", "gateway.queue", "gateway.prefill",
                 "gateway.decode", "gateway.audit.write"):  # fmt: skip
        assert len(names.get(name, [])) == 1, (name, sorted(names))
    server = [s for s in spans if s.context.trace_id == int(PARENT_TRACE, 16) and s.parent
              and s.parent.span_id == int(PARENT_SPAN, 16)]  # fmt: skip
    assert len(server) == 1, "the HTTP span continues the incoming traceparent"
    root = server[0]
    assert root.name.startswith("POST")
    for name in ("gateway.auth", "gateway.policy.decide", "gateway.queue", "gateway.decode",
                 "gateway.audit.write"):  # fmt: skip
        assert names[name][0].parent is not None
        assert names[name][0].parent.span_id == root.context.span_id, name
    assert "sqlite" in {str((s.attributes or {}).get("db.system")) for s in spans} | {
        str((s.attributes or {}).get("db.system.name")) for s in spans
    }, "SQLAlchemy statement spans"

    decide = names["gateway.policy.decide"][0].attributes or {}
    assert decide["gateway.decision.id"] == record["decision_id"]
    assert decide["gateway.policy.revision"] == record["policy_revision"]
    assert decide["gateway.decision.mode"] == "speculative" == record["mode"], record[
        "reason_codes"
    ]
    assert decide["gateway.decision.proposer"] == "draft"
    assert decide["gateway.decision.draft"] == f"{record['draft_model']}@{record['draft_version']}"
    assert list(decide["gateway.decision.reason_codes"]) == record["reason_codes"]
    assert len(decide["gateway.decision.rule_ids"]) >= 1
    assert decide["gateway.decision.batch_rows"] >= 1
    # the cost model's inputs: why the engine chose what it chose, on the batch it assumed
    assert decide["gateway.decision.input.expected_speedup"] > 0
    assert decide["gateway.decision.input.c"] >= 0
    assert 0 <= decide["gateway.decision.input.acceptance"] <= 1
    assert decide["gateway.decision.input.c_source"] in (
        "measured_at_batch",
        "prior",
        "tenant",
        "global",
    )

    decode = names["gateway.decode"][0].attributes or {}
    assert decode["gateway.decode.drafted"] == record["drafted_tokens"] > 0
    assert decode["gateway.decode.accepted"] == record["accepted_tokens"]
    assert decode["gateway.decode.tokens"] == record["completion_tokens"] == 24
    assert decode["gateway.decode.steps"] >= 1
    assert decode["gateway.decode.k"] >= 1
    if record["accepted_tokens"]:
        assert decode["gateway.decode.mean_accepted_length"] > 1

    queue, prefill = names["gateway.queue"][0], names["gateway.prefill"][0]
    dec = names["gateway.decode"][0]
    assert queue.end_time <= prefill.start_time + 1 and prefill.end_time <= dec.start_time + 1
    assert root.start_time <= queue.start_time and dec.end_time <= root.end_time

    assert _text_in_spans(list(spans), "secret_prompt_words") == []
    if len(text.strip()) >= 6:
        assert _text_in_spans(list(spans), text.strip()) == []


async def test_a_stream_is_one_trace_too(
    tiny_manifest: Path, tmp_path: Path, exporter: InMemorySpanExporter
) -> None:
    async with sqlite_gateway(tiny_manifest, tmp_path, tracer_provider=_provider(exporter)) as gw:
        r = await gw.chat(max_tokens=6, temperature=0, stream=True)
        assert r.status_code == 200 and "data: [DONE]" in r.text
        trace_id = r.headers["x-trace-id"]
        rows = await gw.records(trace_id=trace_id)
        assert [x["request_id"] for x in rows] == [r.headers["x-request-id"]]
    names = _by_name(list(exporter.get_finished_spans()), int(trace_id, 16))
    assert {
        "gateway.auth",
        "gateway.policy.decide",
        "gateway.decode",
        "gateway.audit.write",
    } <= set(names)
    assert names["gateway.decode"][0].attributes["gateway.decode.tokens"] == 6


async def test_refused_request_is_traced_and_audited(
    tiny_manifest: Path, tmp_path: Path, exporter: InMemorySpanExporter
) -> None:
    async with sqlite_gateway(tiny_manifest, tmp_path, tracer_provider=_provider(exporter)) as gw:
        r = await gw.client.post(
            "/v1/completions",
            json={"model": "tiny-target", "prompt": "x"},
            headers={"authorization": "Bearer sk-wrong"},
        )
        assert r.status_code == 401
        # traced, but not chained: anyone could grow the audit table (issue 44)
        assert await gw.records(trace_id=r.headers["x-trace-id"]) == []
        r = await gw.client.post("/v1/completions", json={"prompt": "x"}, headers=gw.auth)
        assert r.status_code == 400  # an authenticated caller's refusal is audited
        trace_id = r.headers["x-trace-id"]
        rows = await gw.records(trace_id=trace_id)
        assert [x["status"] for x in rows] == [400]
        r = await gw.client.get("/audit/records", params={"trace_id": "nothex"}, headers=ADMIN)
        assert r.status_code == 200 and r.json()["data"] == []
    auth = [s for s in exporter.get_finished_spans() if s.name == "gateway.auth"]
    assert auth and not auth[0].status.is_ok, "the failed authentication shows on its span"


async def test_tracing_off_by_default(tiny_manifest: Path, tmp_path: Path) -> None:
    async with sqlite_gateway(tiny_manifest, tmp_path) as gw:
        assert not gw.services.tracing.enabled
        r = await gw.complete(max_tokens=3, temperature=0)
        assert r.status_code == 200 and "x-trace-id" not in r.headers
        rows = await gw.records()
        assert rows[0]["trace_id"] is None
        assert not any("OpenTelemetry" in type(m).__name__ for m in gw.app.plugins)


def test_provider_from_env() -> None:
    assert provider_from_env({}) is None
    assert provider_from_env({"OTEL_TRACES_EXPORTER": "none"}) is None
    on: Any = provider_from_env({"OTEL_TRACES_EXPORTER": "memory"})
    assert on is not None and on.resource.attributes["service.name"] == "spec-gateway"
    assert (
        provider_from_env({"OTEL_TRACES_EXPORTER": "memory", "OTEL_SDK_DISABLED": "true"}) is None
    )
    named: Any = provider_from_env({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_SERVICE_NAME": "gw-eu"})
    assert named.resource.attributes["service.name"] == "gw-eu"
    with pytest.raises(TracingConfigError, match="jaeger"):
        provider_from_env({"OTEL_TRACES_EXPORTER": "jaeger"})
    with pytest.raises(TracingConfigError, match="grpc"):
        provider_from_env({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"})
