"""Hostile tenant, bounded work (issue 44): each attack against a real gateway process, with
a negative control that shows the check catches the old behaviour.

- a response_format pattern that makes a backtracking regex take 2**n steps: /health stays
  responsive and the request is answered within a second (RE2, off the event loop);
- long stop strings: refused past MAX_STOP_CHARS, and at the limit a step costs what a
  step without stops costs (the old tail check was quadratic: tests/unit/engine);
- prediction.content in many parts: capped by its joined size;
- a body over the size limit is a 413, JSON nested too deep a 400, in OpenAI's error shape.

Huge prompts and /tokenize: test_bounded_prompts.py. The server and the latency probe
(`probe_during`): bounded.py.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import msgspec
import pytest

from gateway.http.schemas import MAX_STOP_CHARS, ChatCompletionRequest
from gateway.limits import MAX_PREDICTION_CHARS, MAX_STOP
from tests.integration.hostile.bounded import (
    ANSWER_S,
    HEALTH_P99_S,
    MAX_BODY_BYTES,
    Server,
    error_of,
    health_probe,
    loop_probe,
    probe_during,
    serve,
)
from tests.integration.service.harness import MODEL

LETTERS = 40  # the pattern with a{40}: about 2**40 steps for Python's re
EVIL = r"^(?:(a|a)*[^\s\S]|a{%d})$"


@pytest.fixture(scope="module")
def server(tiny_manifest: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    yield from serve(tiny_manifest, tmp_path_factory)


def _evil_schema(letters: int) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {"s": {"type": "string", "pattern": EVIL % letters}},
        "required": ["s"],
        "additionalProperties": False,
    }


def _schema_body(schema: dict[str, Any]) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": "say a"}],
        "max_tokens": 120,
        "temperature": 0,
        "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}},
    }


# -- 1. the regex pattern attack ----------------------------------------------------------


async def test_pattern_attack_keeps_health_responsive(server: Server) -> None:
    async with httpx.AsyncClient(timeout=30) as client:
        body = _schema_body(_evil_schema(LETTERS))

        async def attack() -> httpx.Response:
            return await client.post(
                f"{server.url}/v1/chat/completions", json=body, headers=server.auth
            )

        benign = _schema_body(_evil_schema(LETTERS))
        benign["response_format"]["json_schema"]["schema"]["properties"]["s"]["pattern"] = (
            f"^a{{{LETTERS}}}$"
        )

        async def control() -> httpx.Response:
            return await client.post(
                f"{server.url}/v1/chat/completions", json=benign, headers=server.auth
            )

        await attack()  # warm: the grammar compiled and cached, jsonschema imported
        await control()
        baseline = await probe_during(control, health_probe(client, server.url))
        probe = await probe_during(attack, health_probe(client, server.url))
    print(
        f"pattern a{{{LETTERS}}}: answered in {probe.attack_s:.3f} s (the same output under "
        f"^a{{{LETTERS}}}$: {baseline.attack_s:.3f} s), /health p99 {probe.p99 * 1000:.1f} ms "
        f"over {len(probe.latencies)} probes (benign: {baseline.p99 * 1000:.1f} ms)"
    )
    r = probe.attack_result
    assert r.status_code in (200, 400), r.text
    if r.status_code == 200:  # the grammar forced the 40 letters; validation accepted them
        content = r.json()["choices"][0]["message"]["content"]
        assert msgspec.json.decode(content) == {"s": "a" * LETTERS}
    # decoding the forced 40 letters costs what it costs on this machine (the benign
    # pattern's request); the pattern itself may add less than ANSWER_S
    assert probe.attack_s < baseline.attack_s + ANSWER_S, (probe.attack_s, baseline.attack_s)
    assert probe.p99 < HEALTH_P99_S, (probe.p99, probe.latencies)


async def test_pattern_attack_streamed_keeps_health_responsive(server: Server) -> None:
    """The same attack with stream: true (the stream validates before its final chunk)."""
    async with httpx.AsyncClient(timeout=30) as client:
        body = {**_schema_body(_evil_schema(LETTERS)), "stream": True}

        async def attack() -> str:
            url = f"{server.url}/v1/chat/completions"
            async with client.stream("POST", url, json=body, headers=server.auth) as r:
                assert r.status_code == 200
                return "".join([line async for line in r.aiter_lines()])

        await attack()
        probe = await probe_during(attack, health_probe(client, server.url))
    assert "[DONE]" in probe.attack_result and '"error"' not in probe.attack_result
    assert probe.p99 < HEALTH_P99_S, (probe.p99, probe.latencies)


async def test_negative_control_backtracking_validation_blocks_the_probe() -> None:
    """The old validation (jsonschema with Python's re, on the event loop) against the same
    probe, with 22 letters instead of 40 (about 2**22 steps, a few tenths of a second):
    the probe sees the loop blocked past the limit."""
    letters = 22
    doc = {"s": "a" * letters}
    schema = _evil_schema(letters)

    async def old_validation() -> None:
        jsonschema.Draft202012Validator(schema).is_valid(doc)  # blocks the loop

    probe = await probe_during(old_validation, loop_probe)
    assert re.search(EVIL % letters, "a" * letters)  # the same pattern, the same answer
    assert probe.p99 >= HEALTH_P99_S, probe.latencies


async def test_patterns_re2_cannot_run_or_too_long_are_refused(server: Server) -> None:
    async with httpx.AsyncClient(timeout=30) as client:
        for pattern in (r"(a)\1", "(?=a)a", "a" * 1001):
            schema = {"type": "object", "properties": {"s": {"type": "string", "pattern": pattern}}}
            r = await client.post(
                f"{server.url}/v1/chat/completions", json=_schema_body(schema), headers=server.auth
            )
            assert error_of(r, 400)["param"] == "response_format", pattern


# -- 2. stop strings ----------------------------------------------------------------------


def _stops(length: int) -> list[str]:
    """MAX_STOP stop strings the output never completes, each a distinct first letter then
    spaces: every tail of spaces was a candidate prefix the old check sliced and compared."""
    return [c + " " * (length - 1) for c in "\x01\x02\x03\x04"[:MAX_STOP]]


def test_stop_strings_over_the_limit_are_refused(server: Server) -> None:
    body = {"model": MODEL, "prompt": "x", "max_tokens": 4}
    long = "s" * (MAX_STOP_CHARS + 1)
    r = httpx.post(f"{server.url}/v1/completions", json={**body, "stop": long}, headers=server.auth)
    assert error_of(r, 400)["param"] == "stop"
    stops = ["a", "b", long]
    r = httpx.post(
        f"{server.url}/v1/completions", json={**body, "stop": stops}, headers=server.auth
    )
    assert error_of(r, 400)["param"] == "stop[2]"


def test_stop_strings_at_the_limit_cost_no_more_per_step(server: Server) -> None:
    """The longest stop strings allowed against the longest output: the request costs about
    what it costs without stop strings, and a step of the matcher costs the same at any
    output length. Negative control: the old matcher with the old limit's stop strings (1
    MiB each): a step at 32,000 characters of output (an 8k-token answer) costs over ten
    times a step at 320 (and more than a whole decode step of the tiny model)."""
    body = {
        "model": MODEL, "prompt": "x", "max_tokens": 100, "temperature": 0,
        "decoding": {"mode": "standard"},
    }  # fmt: skip
    url = f"{server.url}/v1/completions"

    def timed(extra: dict[str, Any]) -> tuple[float, str]:
        t0 = time.perf_counter()
        r = httpx.post(url, json={**body, **extra}, headers=server.auth, timeout=60)
        assert r.status_code == 200, r.text
        return time.perf_counter() - t0, r.json()["choices"][0]["text"]

    timed({})  # warm
    plain_s, text = timed({})
    stops_s, stopped_text = timed({"stop": _stops(MAX_STOP_CHARS)})
    assert stopped_text == text  # the stops never matched: the same output
    assert stops_s < 2 * plain_s + 0.3, (plain_s, stops_s)

    from tests.unit.engine.test_stop_strings_linear import OldTextOutput

    step_s = plain_s / body["max_tokens"]  # type: ignore[operator]

    def per_step(out: Any, chars: int) -> float:
        out.add((text * (chars // max(1, len(text)) + 1))[:chars])
        out.releasable()
        t0 = time.perf_counter()
        for _ in range(3):
            out.add("abcd")
            out.releasable()
        return (time.perf_counter() - t0) / 3

    from gateway.engine.detok import TextOutput

    old_stops, new_stops = tuple(_stops(1_048_576)), tuple(_stops(MAX_STOP_CHARS))
    old_short, old_long = (per_step(OldTextOutput(old_stops), n) for n in (320, 32_000))
    new_short, new_long = (per_step(TextOutput(new_stops), n) for n in (320, 32_000))
    print(
        f"stop strings: {plain_s:.3f} s without, {stops_s:.3f} s with 4 x {MAX_STOP_CHARS}; "
        f"a step at 320 / 32,000 characters of output: old matcher (4 x 1 MiB) "
        f"{old_short * 1000:.2f} / {old_long * 1000:.2f} ms, new {new_short * 1000:.3f} / "
        f"{new_long * 1000:.3f} ms; a whole decode step here {step_s * 1000:.2f} ms"
    )
    assert old_long > 10 * old_short, (old_short, old_long)  # grows with the output
    assert new_long < 5 * new_short + 0.001, (new_short, new_long)  # does not


# -- 3. prediction ------------------------------------------------------------------------


def test_prediction_is_capped_by_its_joined_size(server: Server) -> None:
    half = MAX_PREDICTION_CHARS // 2 + 1
    parts = [{"type": "text", "text": "p" * half}, {"type": "text", "text": "q" * half}]
    body = {
        "model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 2,
        "prediction": {"type": "content", "content": parts},
    }  # fmt: skip
    r = httpx.post(f"{server.url}/v1/chat/completions", json=body, headers=server.auth)
    assert error_of(r, 400)["param"] == "prediction"
    # negative control: the schema alone lets it through (each part and the part count are
    # under their caps), which is what was served before
    msgspec.json.decode(msgspec.json.encode(body), type=ChatCompletionRequest)
    body["prediction"]["content"] = parts[:1]
    r = httpx.post(f"{server.url}/v1/chat/completions", json=body, headers=server.auth)
    assert r.status_code == 200, r.text


# -- 5. body size and JSON depth ----------------------------------------------------------


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions", "/tokenize"])
def test_body_over_the_size_limit_is_413(server: Server, path: str) -> None:
    body = b'{"model": "%s", "prompt": "%s"}' % (MODEL.encode(), b"x" * MAX_BODY_BYTES)
    r = httpx.post(f"{server.url}{path}", content=body, headers=server.auth, timeout=30)
    err = error_of(r, 413)
    assert err["type"] == "invalid_request_error" and err["code"] == "request_too_large", err


def test_body_over_the_size_limit_without_content_length_is_413(server: Server) -> None:
    """Streamed in chunks (no content-length): counted as it arrives."""

    def chunks() -> Iterator[bytes]:
        yield b'{"model": "%s", "prompt": "' % MODEL.encode()
        for _ in range(MAX_BODY_BYTES // 65_536 + 2):
            yield b"x" * 65_536
        yield b'"}'

    r = httpx.post(
        f"{server.url}/v1/completions", content=chunks(), headers=server.auth, timeout=30
    )
    error_of(r, 413)


@pytest.mark.parametrize("depth", [2_000, 200_000])
def test_json_nested_too_deep_is_400(server: Server, depth: int) -> None:
    schema = b'{"a":' * depth + b"1" + b"}" * depth
    body = (
        b'{"model": "%s", "messages": [{"role": "user", "content": "x"}], "response_format":'
        b' {"type": "json_schema", "json_schema": {"name": "x", "schema": %s}}}'
        % (MODEL.encode(), schema)
    )
    r = httpx.post(
        f"{server.url}/v1/chat/completions", content=body, headers=server.auth, timeout=30
    )
    err = error_of(r, 400)
    assert "deep" in err["message"], err


def test_negative_control_deep_json_raises_past_the_old_decoder() -> None:
    """What the checks above catch: msgspec raises RecursionError (not a decode error) on
    such a body, which the old decode let through to the 500 handler."""
    depth = 2_000
    body = (
        b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "response_format":'
        b' {"type": "json_schema", "json_schema": {"name": "x", "schema": %s}}}'
        % (b'{"a":' * depth + b"1" + b"}" * depth)
    )
    with pytest.raises(RecursionError):
        msgspec.json.decode(body, type=ChatCompletionRequest)
