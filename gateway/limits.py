"""Request limits, each defined once: the HTTP layer, the policy schema and the engine
read them from here. Pure constants; this module imports nothing of ours."""

from __future__ import annotations

from typing import Final

MAX_K: Final = 64
"""Most draft tokens one verify step may check (policy `speculation.k`, `decoding.k`)."""
MAX_TOP_LOGPROBS: Final = 20
"""Most alternatives per token in `top_logprobs` / completions' `logprobs` (OpenAI's 20)."""
MAX_STOP: Final = 4
"""Most stop strings per request (OpenAI's 4)."""
MAX_SCHEMA_DEPTH: Final = 64
"""Deepest nesting of JSON objects and arrays in a response_format schema (a deeper one is a
400 naming response_format, before anything recurses into it)."""
MAX_SCHEMA_NODES: Final = 20_000
"""Most JSON values (objects, arrays, scalars) in a response_format schema."""
DEFAULT_MAX_TOKENS: Final = {"completions": 16, "chat.completions": 256}
"""max_tokens when the request sets none (OpenAI's defaults), capped by the context left."""
