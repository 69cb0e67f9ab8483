"""Engine results in OpenAI's response and stream-chunk shapes."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence
from typing import Any

from gateway.engine import DecodeResult, TokenLogprob
from gateway.serving.reasoning import split as split_reasoning
from gateway.serving.started import Generation
from gateway.serving.tool_output import Event, ParsedCall, ToolCallReader, format_of, read_calls


def usage(gen: Generation, result: DecodeResult | None) -> dict[str, Any]:
    completion = len(result.token_ids) if result else 0
    stats = result.stats if result else None
    thinking = gen.reasoning_tokens()
    return {
        "prompt_tokens": len(gen.prompt_ids),
        "completion_tokens": completion,
        "total_tokens": len(gen.prompt_ids) + completion,
        "prompt_tokens_details": {"cached_tokens": stats.cached_prompt_tokens if stats else 0},
        "completion_tokens_details": {
            "reasoning_tokens": thinking,
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


def call_id(gen: Generation, index: int, choice: int = 0) -> str:
    """A call's id, unique per request: ``call_<request id>_<index>``, or the length of
    letters and digits the model's tool format demands (Mistral's templates take 9)."""
    where = f"{choice}_{index}" if choice else str(index)
    length = format_of(gen.prepared.schema).id_length
    if length is not None:
        return hashlib.sha256(f"{gen.meta.request_id}:{where}".encode()).hexdigest()[:length]
    return f"call_{gen.meta.request_id[:24]}_{where}"


def _message(
    gen: Generation, result: DecodeResult, index: int
) -> tuple[dict[str, Any], list[ParsedCall]]:
    thought, answer = split_reasoning(result.text, gen.prepared.reasoning)
    if not gen.calls_tools:
        message = {"role": "assistant", "content": answer, "refusal": None}
        return _thinking(message, thought), []
    content, calls = read_calls(answer, format_of(gen.prepared.schema))
    message = _thinking({"role": "assistant", "content": content or None, "refusal": None}, thought)
    if calls:
        message["tool_calls"] = [
            {
                "id": call_id(gen, i, index),
                "type": "function",
                "function": {"name": c.name, "arguments": c.arguments},
            }
            for i, c in enumerate(calls)
        ]
    return message, calls


def _thinking(message: dict[str, Any], thought: str | None) -> dict[str, Any]:
    """A thinking model's message carries its thinking apart (`reasoning_content`, as
    vLLM, SGLang and DeepSeek's API return it); other models' messages are unchanged."""
    if thought is not None:
        message["reasoning_content"] = thought
    return message


def response_id(gen: Generation) -> str:
    prefix = "chatcmpl" if gen.command.endpoint == "chat.completions" else "cmpl"
    return f"{prefix}-{gen.meta.request_id}"


def _choice(gen: Generation, index: int, result: DecodeResult) -> dict[str, Any]:
    logprobs = gen.command.sampling.logprobs
    if gen.command.endpoint == "chat.completions":
        message, calls = _message(gen, result, index)
        return {
            "index": index,
            "message": message,
            "logprobs": chat_logprobs(result.logprobs) if logprobs else None,
            "finish_reason": finish_reason(result, calls),
        }
    return {
        "index": index,
        "text": result.text,
        "logprobs": completion_logprobs(result.logprobs, 0) if logprobs else None,
        "finish_reason": finish_reason(result),
    }


def full_response(gen: Generation, results: Sequence[DecodeResult]) -> dict[str, Any]:
    chat = gen.command.endpoint == "chat.completions"
    return {
        "id": response_id(gen),
        "object": "chat.completion" if chat else "text_completion",
        "created": int(time.time()),
        "model": gen.command.model,
        "choices": [_choice(gen, i, r) for i, r in enumerate(results)],
        "usage": usage(gen, gen.result),
        "system_fingerprint": gen.decision.policy_revision,
    }


class ChunkWriter:
    """Builds the stream chunks of one response (chat or legacy completions), each choice
    with its own offsets, tool-call reader and held-back logprobs."""

    def __init__(self, gen: Generation) -> None:
        self.gen = gen
        self.chat = gen.command.endpoint == "chat.completions"
        self.created = int(time.time())
        n = len(gen.choices)
        self.offset = [0] * n
        fmt = format_of(gen.prepared.schema)
        self.readers = [ToolCallReader(fmt) for _ in range(n)] if gen.calls_tools else None
        thinks = gen.prepared.reasoning
        self.thinking = [thinks.reader() for _ in range(n)] if thinks else None
        self.held: list[list[TokenLogprob]] = [[] for _ in range(n)]

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

    def first(self) -> list[dict[str, Any]]:
        if not self.chat:
            return []
        delta = {"role": "assistant", "content": ""}
        return [
            self._chunk([{"index": i, "delta": delta, "logprobs": None, "finish_reason": None}])
            for i in range(len(self.gen.choices))
        ]

    def deltas(
        self, index: int, text: str, logprobs: Sequence[TokenLogprob]
    ) -> list[dict[str, Any]]:
        """The chunks of one engine delta: one, or with tools one per content / call /
        arguments event (none while the reader holds back a possible tag); a thinking
        model's thinking as `reasoning_content` deltas first."""
        if self.thinking is None:
            return self._answer(index, text, logprobs)
        chunks: list[dict[str, Any]] = []
        for kind, part in self.thinking[index].feed(text):
            if kind == "reasoning":
                chunks.append(self._reasoning(index, part, logprobs))
            else:
                chunks += self._answer(index, part, logprobs)
            logprobs = ()  # the delta's logprobs go with its first chunk
        if not chunks:
            self.held[index].extend(logprobs)
        return chunks

    def _answer(
        self, index: int, text: str, logprobs: Sequence[TokenLogprob]
    ) -> list[dict[str, Any]]:
        if self.readers is None:
            held, self.held[index] = self.held[index], []
            return [self.delta(index, text, [*held, *logprobs])]
        return self._events(index, self.readers[index].feed(text), logprobs)

    def _reasoning(self, index: int, text: str, logprobs: Sequence[TokenLogprob]) -> dict[str, Any]:
        want = self.gen.command.sampling.logprobs
        held, self.held[index] = self.held[index], []
        lp = chat_logprobs([*held, *logprobs]) if want else None
        delta = {"reasoning_content": text}
        return self._chunk(
            [{"index": index, "delta": delta, "logprobs": lp, "finish_reason": None}]
        )

    def _events(
        self, index: int, events: list[Event], logprobs: Sequence[TokenLogprob]
    ) -> list[dict[str, Any]]:
        self.held[index].extend(logprobs)
        chunks = []
        for event in events:
            if event[0] == "content":
                delta: dict[str, Any] = {"content": event[1]}
            elif event[0] == "call":
                i, name = event[1], event[2]
                delta = {"tool_calls": [{
                    "index": i, "id": call_id(self.gen, i, index), "type": "function",
                    "function": {"name": name, "arguments": ""},
                }]}  # fmt: skip
            else:
                delta = {"tool_calls": [{"index": event[1], "function": {"arguments": event[2]}}]}
            want = self.gen.command.sampling.logprobs and not chunks
            lp = chat_logprobs(self.held[index]) if want else None
            choice = {"index": index, "delta": delta, "logprobs": lp, "finish_reason": None}
            chunks.append(self._chunk([choice]))
        if chunks:
            self.held[index] = []
        return chunks

    def delta(self, index: int, text: str, logprobs: Sequence[TokenLogprob]) -> dict[str, Any]:
        want = self.gen.command.sampling.logprobs
        if self.chat:
            choice: dict[str, Any] = {
                "index": index,
                "delta": {"content": text},
                "logprobs": chat_logprobs(logprobs) if want else None,
                "finish_reason": None,
            }
        else:
            choice = {
                "index": index,
                "text": text,
                "logprobs": completion_logprobs(logprobs, self.offset[index]) if want else None,
                "finish_reason": None,
            }
            self.offset[index] += sum(len(lp.token) for lp in logprobs)
        return self._chunk([choice])

    def last(self) -> list[dict[str, Any]]:
        """Per choice: what its reader still held, then its chunk with the finish reason."""
        chunks: list[dict[str, Any]] = []
        for index, c in enumerate(self.gen.choices):
            assert c.result is not None
            calls: list[ParsedCall] = []
            if self.thinking is not None:
                for kind, part in self.thinking[index].finish():
                    if kind == "reasoning":
                        chunks.append(self._reasoning(index, part, ()))
                    else:
                        chunks += self._answer(index, part, ())
            if self.readers is not None:
                chunks += self._events(index, self.readers[index].finish(), ())
                calls = self.readers[index].calls
            reason = finish_reason(c.result, calls)
            if self.chat:
                choice = {"index": index, "delta": {}, "logprobs": None, "finish_reason": reason}
            else:
                choice = {"index": index, "text": "", "logprobs": None, "finish_reason": reason}
            chunks.append(self._chunk([choice]))
        return chunks

    def usage(self, result: DecodeResult) -> dict[str, Any]:
        return self._chunk([], usage=usage(self.gen, result))
