"""Bounded work before admission (issue 44): the cheap prompt checks, the per-tenant gate
on the tokenizing threads, and output validation off the event loop within its budget."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from gateway.engine.constraints.json_schema import ConstraintError
from gateway.serving import prepare as prep
from gateway.serving import tool_output
from gateway.serving.commands import Generate
from gateway.serving.errors import GatewayError


class Tok:
    """What the cheap checks read of a tokenizer: its vocabulary."""

    def __init__(self, longest: int) -> None:
        self.vocab = {"a": 0, "b" * longest: 1}
        self.calls = 0

    def get_vocab(self) -> dict[str, int]:
        self.calls += 1
        return self.vocab


def _chat(*contents: str) -> Generate:
    messages = tuple({"role": "user", "content": c} for c in contents)
    return Generate(endpoint="chat.completions", model="m", messages=messages)


def test_prompt_chars_counts_every_message_and_tool_call() -> None:
    cmd = _chat("abc", "de")
    assert prep.prompt_chars(cmd) == 5
    call = {"id": "1", "type": "function", "function": {"name": "f", "arguments": {"x": 1}}}
    with_call = Generate(
        endpoint="chat.completions",
        model="m",
        messages=({"role": "assistant", "content": "", "tool_calls": [call]},),
    )
    assert prep.prompt_chars(with_call) == len(str({"x": 1}))
    thought = {"role": "assistant", "content": "ok", "reasoning_content": "hmm."}
    assert prep.prompt_chars(Generate(endpoint="chat.completions", model="m",
                                      messages=(thought,))) == 6  # fmt: skip
    assert prep.prompt_chars(Generate(endpoint="completions", model="m", prompt=(1, 2))) == 2


def test_raw_prompt_over_the_limit_is_refused() -> None:
    half = prep.MAX_PROMPT_CHARS // 2 + 1
    with pytest.raises(GatewayError) as exc:
        prep.check_prompt_size(_chat("x" * half, "y" * half))
    assert exc.value.kind == "invalid_request" and exc.value.param == "messages"
    prep.check_prompt_size(_chat("x" * half))


def test_a_prompt_that_cannot_fit_is_refused_before_tokenizing() -> None:
    tok = Tok(longest=4)
    assert prep.max_token_chars(tok) == 4 and prep.max_token_chars(tok) == 4
    assert tok.calls == 1  # cached per tokenizer
    prep.check_fits(_chat("x" * 400), tok, 100)  # 400 <= 100 tokens x 4 characters
    with pytest.raises(GatewayError) as exc:
        prep.check_fits(_chat("x" * 401), tok, 100)
    assert exc.value.kind == "context_length" and exc.value.code == "context_length_exceeded"
    ids = Generate(endpoint="completions", model="m", prompt=tuple(range(101)))
    with pytest.raises(GatewayError):
        prep.check_fits(ids, tok, 100)  # token ids count one each


async def test_the_gate_holds_one_tenant_not_the_others() -> None:
    gate = prep.TenantGate(2)
    release = asyncio.Event()
    entered: list[str] = []

    async def work(tenant: str) -> None:
        async with gate.hold(tenant):
            entered.append(tenant)
            await release.wait()

    hog = [asyncio.create_task(work("hog")) for _ in range(5)]
    await asyncio.sleep(0.01)
    assert entered == ["hog", "hog"]  # two at a time, three wait
    other = asyncio.create_task(work("other"))
    await asyncio.sleep(0.01)
    assert entered[-1] == "other"  # not behind the hog's queue
    release.set()
    await asyncio.gather(*hog, other)
    assert entered.count("hog") == 5 and not gate._slots  # nothing left behind


async def _loop_lag_during(coro: Any) -> tuple[float, Any]:
    """The event loop's longest lag (ms-ticks) while `coro` runs, and its result or error."""
    lags: list[float] = []
    done = False

    async def tick() -> None:
        while not done:
            t0 = time.perf_counter()
            await asyncio.sleep(0.005)
            lags.append(time.perf_counter() - t0 - 0.005)

    ticker = asyncio.create_task(tick())
    await asyncio.sleep(0.02)
    try:
        result: Any = await coro
    except Exception as exc:
        result = exc
    done = True
    await ticker
    return max(lags), result


def _slow_validation(text: str, schema: Any) -> None:
    time.sleep(0.6)  # a validation that would hold whatever thread runs it


async def test_validation_runs_off_the_loop_within_its_budget(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(tool_output, "validate_output", _slow_validation)
    t0 = time.perf_counter()
    lag, result = await _loop_lag_during(tool_output.check_output("{}", {}, budget_s=0.2))
    assert time.perf_counter() - t0 < 0.5  # refused at the budget, not after the work
    assert isinstance(result, GatewayError) and result.code == "schema_validation_timeout"
    assert result.param == "response_format" and result.kind == "invalid_request"
    assert lag < 0.1, lag


async def test_negative_control_validation_on_the_loop_blocks_it() -> None:
    """The old _check_constraint called the validator on the loop: the same lag probe sees
    the whole validation as one lag."""

    async def old() -> None:
        _slow_validation("{}", {})

    lag, _ = await _loop_lag_during(old())
    assert lag >= 0.5, lag


async def test_check_output_validates_tool_arguments() -> None:
    tools = {"f": {"type": "object", "properties": {"s": {"pattern": r"^(?:(a|a)*b|a{40})$"}}}}
    text = '<tool_call>{"name":"f","arguments":{"s":"%s"}}</tool_call>' % ("a" * 40)
    from gateway.engine.constraints.tool_calls import CLOSE, OPEN

    text = text.replace("<tool_call>", OPEN).replace("</tool_call>", CLOSE)
    t0 = time.perf_counter()
    await tool_output.check_output(text, None, tools)
    with pytest.raises(ConstraintError, match="does not match"):
        await tool_output.check_output(text.replace("a" * 40, "a" * 39), None, tools)
    assert time.perf_counter() - t0 < 0.5


def test_prompt_chars_counts_the_tool_definitions() -> None:
    from gateway.serving.commands import Tools, ToolSpec

    definition = {"type": "function", "function": {"name": "f", "description": "d" * 100}}
    tools = Tools((ToolSpec("f", {"type": "object"}),), (definition,))
    cmd = Generate(
        endpoint="chat.completions",
        model="m",
        messages=({"role": "user", "content": "abc"},),
        tools=tools,
    )
    assert prep.prompt_chars(cmd) > 103


def _policy(rpm: int) -> Any:
    from types import SimpleNamespace

    from gateway.serving.ratelimit import Limits

    return SimpleNamespace(limits_for=lambda tenant: Limits(rpm, 10**6))


async def test_a_full_request_window_refuses_before_any_work() -> None:
    from gateway.serving.ratelimit import RateLimiter

    limiter, policy = RateLimiter(), _policy(2)
    quotas = [(await prep.admit_tokenize(limiter, policy, "t"))[0] for _ in range(2)]
    assert quotas[-1].remaining_requests == 0
    with pytest.raises(GatewayError) as exc:
        prep.check_request_rate(limiter, policy, "t")  # known full: no limiter call needed
    assert exc.value.kind == "rate_limited" and exc.value.retry_after
    prep.check_request_rate(limiter, policy, "other")  # only that tenant
    prep.check_request_rate(RateLimiter(), policy, "t")  # only that limiter (app)
    prep.check_request_rate(limiter, _policy(3), "t")  # a raised limit applies at once
    prep.check_request_rate(limiter, policy, "t")  # and the note is gone


async def test_the_note_ends_when_the_window_frees_a_request() -> None:
    from gateway.serving.ratelimit import RateLimiter

    limiter, policy = RateLimiter(), _policy(1)
    clock = [1000.0]
    limiter._now = lambda: clock[0]  # type: ignore[method-assign]
    await prep.admit_tokenize(limiter, policy, "t")  # an empty window: reset 0, no note
    prep.check_request_rate(limiter, policy, "t")
    clock[0] += 30
    with pytest.raises(GatewayError):
        await prep.admit_tokenize(limiter, policy, "t")  # refused by the limiter: noted
    with pytest.raises(GatewayError):
        prep.check_request_rate(limiter, policy, "t")
    entry = prep._full_windows[limiter]["t"]
    entry.until = time.monotonic() - 1  # the oldest request has left the window
    prep.check_request_rate(limiter, policy, "t")
