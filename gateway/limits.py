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
MAX_MESSAGES: Final = 2048
"""Most messages in one chat request (a longer conversation is refused with a 400 naming
messages before it is templated; the context length bounds what is served anyway)."""
MAX_PREDICTION_CHARS: Final = 65_536
"""Longest `prediction` text, in characters (the proposer searches it at every step)."""
MAX_TEXT_CHARS: Final = 1_048_576
"""Longest prompt or message text, in characters, before tokenization (1 MiB; the context
length refuses far less once tokenized, this only bounds the tokenizer's work)."""
INT64_MIN: Final = -(2**63)
INT64_MAX: Final = 2**63 - 1
"""Integers the database and the engine's generators hold (seeds, record ids)."""
INT32_MAX: Final = 2**31 - 1
"""Largest value of a 32-bit audit column (top_k is stored as one)."""
MAX_TENANT_NAME: Final = 256
"""Longest tenant display name (its database column)."""
MAX_TOOLS: Final = 128
"""Most functions in one chat request's `tools` (OpenAI's 128)."""
MAX_TOOL_CALLS: Final = 128
"""Most `tool_calls` in one assistant message of a conversation."""
MAX_USER_CHARS: Final = 256
"""Longest `user` (end-user id); the audit record keeps its SHA-256 only."""
MAX_CHOICES: Final = 8
"""Largest `n`: each choice is one row of the target's batch (GATEWAY_MAX_BATCH, 8 by
default, rows share every forward; more rows wait in the queue)."""
