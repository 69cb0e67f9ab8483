"""schemathesis hooks for the gateway's fuzz runs (SCHEMATHESIS_HOOKS names this module).

The API allows max_tokens up to the context; the fuzz configuration, not the API, keeps
generations short so that a run covers many requests: a generated max_tokens (or
max_completion_tokens) above FUZZ_MAX_TOKENS is lowered to it, and a body without one gets
it. A string ``model`` names the served tiny target, so that requests reach the engine
instead of a 404. Only values the schema allows are changed (2**63 stays, so a negative case stays
negative); a body that is not an object is left as it was."""

from __future__ import annotations

from typing import Any

import schemathesis

from gateway.limits import INT64_MAX
from tests.integration.service.harness import MODEL

FUZZ_MAX_TOKENS = 4
INFERENCE = {"/v1/chat/completions", "/v1/completions"}
MODEL_BODIES = {*INFERENCE, "/tokenize"}


@schemathesis.hook
def map_body(context: Any, body: Any) -> Any:
    path = context.operation.path if context.operation is not None else None
    if path not in MODEL_BODIES or not isinstance(body, dict):
        return body
    if isinstance(body.get("model"), str):
        body["model"] = MODEL
    if path not in INFERENCE:
        return body
    keys = [k for k in ("max_tokens", "max_completion_tokens") if k in body]
    for key in keys:
        value = body[key]
        is_int = isinstance(value, int) and not isinstance(value, bool)
        if is_int and FUZZ_MAX_TOKENS < value <= INT64_MAX:
            body[key] = FUZZ_MAX_TOKENS
    if not keys:
        body["max_tokens"] = FUZZ_MAX_TOKENS
    return body
