"""Engine results in OpenAI's response and stream-chunk shapes."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from gateway.engine import DecodeResult, TokenLogprob
from gateway.serving.generation import Generation


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


def finish_reason(result: DecodeResult) -> str:
    return "length" if result.finish_reason == "length" else "stop"


def response_id(gen: Generation) -> str:
    prefix = "chatcmpl" if gen.command.endpoint == "chat.completions" else "cmpl"
    return f"{prefix}-{gen.meta.request_id}"


def full_response(gen: Generation, result: DecodeResult) -> dict[str, Any]:
    created = int(time.time())
    if gen.command.endpoint == "chat.completions":
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": result.text, "refusal": None},
            "logprobs": chat_logprobs(result.logprobs) if gen.command.sampling.logprobs else None,
            "finish_reason": finish_reason(result),
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

    def last(self, result: DecodeResult) -> dict[str, Any]:
        reason = finish_reason(result)
        if self.chat:
            choice = {"index": 0, "delta": {}, "logprobs": None, "finish_reason": reason}
        else:
            choice = {"index": 0, "text": "", "logprobs": None, "finish_reason": reason}
        return self._chunk([choice])

    def usage(self, result: DecodeResult) -> dict[str, Any]:
        return self._chunk([], usage=usage(self.gen, result))
