"""Engine results in OpenAI's response and stream-chunk shapes."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from gateway.engine import DecodeResult, TokenLogprob
from gateway.serving.generation import Generation
from gateway.serving.tool_output import Event, ParsedCall, ToolCallReader, read_calls


def usage(gen: Generation, result: DecodeResult | None) -> dict[str, Any]:
    completion = len(result.token_ids) if result else 0
    stats = result.stats if result else None
    return {
        "prompt_tokens": len(gen.prompt_ids),
        "completion_tokens": completion,
        "total_tokens": len(gen.prompt_ids) + completion,
        "completion_tokens_details": {
            "reasoning_tokens": 0,
            "accepted_prediction_tokens": stats.accepted if stats else 0,
            "rejected_prediction_tokens": stats.rejected if stats else 0,
        },
    }


def _bytes(token: str) -> list[int]:
    return list(token.encode("utf-8", errors="replace"))


def chat_logprobs(items: Sequence[TokenLogprob]) -> dict[str, Any]:
    return {
        "content": [
            {
                "token": lp.token,
                "logprob": lp.logprob,
                "bytes": _bytes(lp.token),
                "top_logprobs": [
                    {"token": t, "logprob": v, "bytes": _bytes(t)} for _, t, v in lp.top
                ],
            }
            for lp in items
        ]
    }


def completion_logprobs(items: Sequence[TokenLogprob], start_offset: int) -> dict[str, Any]:
    offsets, pos = [], start_offset
    for lp in items:
        offsets.append(pos)
        pos += len(lp.token)
    return {
        "tokens": [lp.token for lp in items],
        "token_logprobs": [lp.logprob for lp in items],
        "top_logprobs": [{t: v for _, t, v in lp.top} for lp in items],
        "text_offset": offsets,
    }


def finish_reason(result: DecodeResult, calls: Sequence[ParsedCall] = ()) -> str:
    if calls and all(c.complete for c in calls) and result.finish_reason == "stop":
        return "tool_calls"
    return "length" if result.finish_reason == "length" else "stop"


def call_id(gen: Generation, index: int) -> str:
    return f"call_{gen.meta.request_id[:24]}_{index}"


def _message(gen: Generation, result: DecodeResult) -> tuple[dict[str, Any], list[ParsedCall]]:
    if not gen.calls_tools:
        return {"role": "assistant", "content": result.text, "refusal": None}, []
    content, calls = read_calls(result.text)
    message: dict[str, Any] = {"role": "assistant", "content": content or None, "refusal": None}
    if calls:
        message["tool_calls"] = [
            {
                "id": call_id(gen, i),
                "type": "function",
                "function": {"name": c.name, "arguments": c.arguments},
            }
            for i, c in enumerate(calls)
        ]
    return message, calls


def response_id(gen: Generation) -> str:
    prefix = "chatcmpl" if gen.command.endpoint == "chat.completions" else "cmpl"
    return f"{prefix}-{gen.meta.request_id}"


def full_response(gen: Generation, result: DecodeResult) -> dict[str, Any]:
    created = int(time.time())
    if gen.command.endpoint == "chat.completions":
        message, calls = _message(gen, result)
        choice: dict[str, Any] = {
            "index": 0,
            "message": message,
            "logprobs": chat_logprobs(result.logprobs) if gen.command.sampling.logprobs else None,
            "finish_reason": finish_reason(result, calls),
        }
        obj = "chat.completion"
    else:
        choice = {
            "index": 0,
            "text": result.text,
            "logprobs": completion_logprobs(result.logprobs, 0)
            if gen.command.sampling.logprobs
            else None,
            "finish_reason": finish_reason(result),
        }
        obj = "text_completion"
    return {
        "id": response_id(gen),
        "object": obj,
        "created": created,
        "model": gen.command.model,
        "choices": [choice],
        "usage": usage(gen, result),
        "system_fingerprint": gen.decision.policy_revision,
    }


class ChunkWriter:
    """Builds the stream chunks of one response (chat or legacy completions)."""

    def __init__(self, gen: Generation) -> None:
        self.gen = gen
        self.chat = gen.command.endpoint == "chat.completions"
        self.created = int(time.time())
        self.offset = 0
        self.reader = ToolCallReader() if gen.calls_tools else None
        self.held: list[TokenLogprob] = []  # logprobs of text the reader still holds

    def _chunk(self, choices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
        return {
            "id": response_id(self.gen),
            "object": "chat.completion.chunk" if self.chat else "text_completion",
            "created": self.created,
            "model": self.gen.command.model,
            "system_fingerprint": self.gen.decision.policy_revision,
            "choices": choices,
            **extra,
        }

    def first(self) -> dict[str, Any] | None:
        if not self.chat:
            return None
        delta = {"role": "assistant", "content": ""}
        return self._chunk([{"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}])

    def deltas(self, text: str, logprobs: Sequence[TokenLogprob]) -> list[dict[str, Any]]:
        """The chunks of one engine delta: one, or with tools one per content / call /
        arguments event (none while the reader holds back a possible tag)."""
        if self.reader is None:
            return [self.delta(text, logprobs)]
        return self._events(self.reader.feed(text), logprobs)

    def _events(
        self, events: list[Event], logprobs: Sequence[TokenLogprob]
    ) -> list[dict[str, Any]]:
        self.held.extend(logprobs)
        chunks = []
        for event in events:
            if event[0] == "content":
                delta: dict[str, Any] = {"content": event[1]}
            elif event[0] == "call":
                index, name = event[1], event[2]
                delta = {"tool_calls": [{
                    "index": index, "id": call_id(self.gen, index), "type": "function",
                    "function": {"name": name, "arguments": ""},
                }]}  # fmt: skip
            else:
                delta = {"tool_calls": [{"index": event[1], "function": {"arguments": event[2]}}]}
            want = self.gen.command.sampling.logprobs and not chunks
            lp = chat_logprobs(self.held) if want else None
            chunks.append(
                self._chunk([{"index": 0, "delta": delta, "logprobs": lp, "finish_reason": None}])
            )
        if chunks:
            self.held = []
        return chunks

    def delta(self, text: str, logprobs: Sequence[TokenLogprob]) -> dict[str, Any]:
        want = self.gen.command.sampling.logprobs
        if self.chat:
            choice: dict[str, Any] = {
                "index": 0,
                "delta": {"content": text},
                "logprobs": chat_logprobs(logprobs) if want else None,
                "finish_reason": None,
            }
        else:
            choice = {
                "index": 0,
                "text": text,
                "logprobs": completion_logprobs(logprobs, self.offset) if want else None,
                "finish_reason": None,
            }
            self.offset += sum(len(lp.token) for lp in logprobs)
        return self._chunk([choice])

    def last(self, result: DecodeResult) -> list[dict[str, Any]]:
        """What the reader still held, then the chunk with the finish reason."""
        chunks, calls = [], []
        if self.reader is not None:
            chunks = self._events(self.reader.finish(), ())
            calls = self.reader.calls
        reason = finish_reason(result, calls)
        if self.chat:
            choice = {"index": 0, "delta": {}, "logprobs": None, "finish_reason": reason}
        else:
            choice = {"index": 0, "text": "", "logprobs": None, "finish_reason": reason}
        return [*chunks, self._chunk([choice])]

    def usage(self, result: DecodeResult) -> dict[str, Any]:
        return self._chunk([], usage=usage(self.gen, result))
