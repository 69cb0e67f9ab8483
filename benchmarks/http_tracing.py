"""What tracing costs: the gateway over HTTP with tracing off (the default) and on.

Same demo pair, prompts and decoding as benchmarks/http.py (greedy, 128 new tokens, standard
and speculative with draft v2), one request at a time over a kept-alive connection, in a
real gateway process. "On" is OTEL_TRACES_EXPORTER=memory: every span is made (HTTP,
auth, decision, queue, prefill, decode, audit write, each SQL statement) and kept in the
process's in-memory exporter, so the cost measured is the instrumentation's, not a
network's. The two sides never run together; each round starts one process, measures it,
stops it, then the other, alternating which goes first. Goal: on/off tokens/s >= 0.98.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx

from benchmarks._server import gateway
from benchmarks.http import MODES, NEW_TOKENS, _manifest, _prompts, measure_modes

SIDES = {"off": "none", "on": "memory"}
# Pinned: left to its load-time timing, the linear forward differed between the processes
# of one run, and that, not tracing, set the rounds apart.
CPU_LINEAR = os.environ.get("GATEWAY_CPU_LINEAR", "off")
GOAL = 0.98
SPAN_REPEATS = 2000


def span_cost_per_request() -> float:
    """Seconds the serving layer's spans of one request take with the in-memory exporter
    (auth, decision with its attributes, queue/prefill/decode of one row, audit write),
    measured in this process: a number a busy machine cannot blur much. The HTTP and SQL
    spans come on top (the end-to-end rounds include them)."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from gateway.engine.stats import DecodeStats
    from gateway.serving.tracing import Tracing

    provider = TracerProvider()
    memory = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracing = Tracing(provider)
    stats = DecodeStats(mode="speculative", drafted=96, accepted=60, num_drafts=32)
    stats.k_history = [3] * 32
    job = SimpleNamespace(
        submitted_ns=1, admitted_ns=2, first_event_ns=3, finished_ns=4
    )  # the worker's stamps
    decision = {f"gateway.decision.attr{i}": "x" * 16 for i in range(14)}
    t0 = time.perf_counter()
    for _ in range(SPAN_REPEATS):
        with tracing.span("request"):
            with tracing.span("gateway.auth") as span:
                span.set_attributes({"gateway.role": "tenant", "gateway.tenant": "t"})
            with tracing.span("gateway.policy.decide") as span:
                span.set_attributes(decision)
            tracing.run([job], [stats])  # type: ignore[list-item]
            with tracing.span("gateway.audit.write", {"gateway.request_id": "r"}):
                tracing.trace_id()
        memory.clear()
    return (time.perf_counter() - t0) / SPAN_REPEATS


def _round(prompts: list[str], exporter: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with (
        tempfile.TemporaryDirectory() as tmp,
        gateway(
            GATEWAY_MODELS=str(_manifest(Path(tmp))),
            OTEL_TRACES_EXPORTER=exporter,
            GATEWAY_CPU_LINEAR=CPU_LINEAR,
        ) as gw,
        httpx.Client(base_url=gw.url, timeout=600) as client,
    ):
        key = gw.tenant("bench", {"client_override": {"allow": True}})
        out.update(measure_modes(gw, client, key, prompts))
        traced = client.post(
            "/v1/completions",
            json={"model": "demo-code-target", "prompt": prompts[0], "max_tokens": 4},
            headers={"authorization": f"Bearer {key}"},
        )
        out["x_trace_id"] = "x-trace-id" in traced.headers
    return out


def run(out_dir: Path, quick: bool = False) -> dict[str, Any]:
    prompts = _prompts(quick)
    rounds = 2 if quick else 4
    sides: dict[str, list[dict[str, Any]]] = {"off": [], "on": []}
    for i in range(rounds):
        order = ("off", "on") if i % 2 == 0 else ("on", "off")
        for side in order:
            sides[side].append(_round(prompts, SIDES[side]))
        line = ", ".join(
            f"{m} off {sides['off'][-1][m]['tokens_per_s']:.1f} / on "
            f"{sides['on'][-1][m]['tokens_per_s']:.1f} tok/s"
            for m in MODES
        )
        print(f"   round {i + 1}/{rounds}: {line}", flush=True)
    assert all(r["x_trace_id"] for r in sides["on"]), "tracing on: every answer has x-trace-id"
    assert not any(r["x_trace_id"] for r in sides["off"]), "tracing off: no trace id"

    def median(side: str, mode: str, key: str) -> float:
        return statistics.median(r[mode][key] for r in sides[side])

    tps = {s: {m: median(s, m, "tokens_per_s") for m in MODES} for s in sides}
    span_s = span_cost_per_request()
    request_s = {m: NEW_TOKENS / tps["off"][m] for m in MODES}
    return {
        "setup": {
            "prompts": len(prompts),
            "new_tokens": NEW_TOKENS,
            "rounds": rounds,
            "greedy": True,
            "draft": "demo-code-draft@2",
            "cores": os.cpu_count(),
            "on": "OTEL_TRACES_EXPORTER=memory (every span made and kept in the process)",
            "cpu_linear": CPU_LINEAR,
            "off": "the default: no exporter, no middleware, no database hook",
        },
        "tokens_per_s": tps,
        "cpu": {s: {m: median(s, m, "cpu") for m in MODES} for s in sides},
        "on_over_off": {m: tps["on"][m] / tps["off"][m] for m in MODES},
        "on_over_off_by_round": {
            m: [
                on[m]["tokens_per_s"] / off[m]["tokens_per_s"]
                for on, off in zip(sides["on"], sides["off"], strict=True)
            ]
            for m in MODES
        },
        "goal_on_over_off": GOAL,
        "serving_spans_us_per_request": span_s * 1e6,
        "serving_spans_share_of_a_request": {m: span_s / request_s[m] for m in MODES},
    }
