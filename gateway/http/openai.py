"""OpenAI-compatible endpoints: /v1/models, /v1/chat/completions, /v1/completions, /tokenize."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import msgspec
from litestar import Request, Response, get, post
from litestar.response import Stream

from gateway.http import convert
from gateway.http.bodies import DeferredBody, decode_body
from gateway.http.errors import STATUS, error_body, error_response
from gateway.http.render import ChunkWriter, full_response
from gateway.http.schemas import ChatCompletionRequest, CompletionRequest, TokenizeRequest
from gateway.serving import Services
from gateway.serving.commands import Generate, Principal, RequestMeta
from gateway.serving.errors import GatewayError, invalid
from gateway.serving.generation import Generation
from gateway.serving.prepare import admit_tokenize, tokenize_off_loop


def services(request: Request[Any, Any, Any]) -> Services:
    return request.app.state.services  # type: ignore[no-any-return]


def _internal(request: Request[Any, Any, Any], exc: Exception) -> GatewayError:
    request.logger.exception("unhandled error", exc_info=exc)
    return GatewayError("internal", "internal error; the x-request-id header names it")


def _who(principal: Principal, meta: RequestMeta) -> dict[str, str]:
    """The auth span's attributes: who called (ids, never the key)."""
    return {
        "gateway.request_id": meta.request_id,
        "gateway.role": principal.role,
        "gateway.tenant": principal.tenant_id or "",
        "gateway.key_id": principal.key_id or "",
    }


def _sse(obj: Any) -> bytes:
    return b"data: " + msgspec.json.encode(obj) + b"\n\n"


async def _serve(request: Request[Any, Any, Any], endpoint: str, kind: type[Any]) -> Response[Any]:
    svc = services(request)
    meta = RequestMeta(uuid.uuid4().hex, endpoint, time.perf_counter(), svc.tracing.trace_id())
    base_headers = Generation.meta_headers(meta)
    principal: Principal | None = None
    cmd: Generate | None = None
    try:
        with svc.tracing.span("gateway.auth") as span:
            principal = await svc.auth.principal(request.headers.get("authorization"))
            if span is not None:
                span.set_attributes(_who(principal, meta))
        body = decode_body(await request.body(), kind)
        cmd = convert.to_command(body)
        gen = await svc.generation.start(principal, meta, cmd)
    except Exception as exc:  # every refusal is audited, unexpected ones too
        err = exc if isinstance(exc, GatewayError) else _internal(request, exc)
        await svc.generation.refuse(principal, meta, cmd, err)
        return error_response(err, base_headers)
    headers = {**gen.headers(), **convert.ratelimit_headers(gen.quota)}
    if cmd.stream:
        return Stream(_stream(gen), media_type="text/event-stream", headers=headers)
    try:
        results = await gen.collect()
    except GatewayError as err:
        gen.cancel()
        await _finish_or_error(gen, STATUS[err.kind], err)
        return error_response(err, headers)
    audit_error = await _finish_or_error(gen, 200, None)
    if audit_error is not None:
        return error_response(audit_error, headers)
    return Response(full_response(gen, results), headers=headers)


async def _finish_or_error(
    gen: Generation, status: int, err: GatewayError | None
) -> GatewayError | None:
    """Write the audit record; its failure is the request's failure (fail-closed)."""
    try:
        await gen.finish(status, err)
    except GatewayError as audit_err:
        return audit_err
    return None


async def _stream(gen: Generation) -> AsyncIterator[bytes]:
    """SSE: chunks, the final chunk, usage (when asked), then [DONE]. The audit record is
    written before the final usage chunk; a client that disconnects cancels the engine run
    at its next step and the record is written with status 499."""
    writer = ChunkWriter(gen)
    completed = False
    try:
        for chunk in writer.first():
            yield _sse(chunk)
        async for index, delta in gen.deltas():
            for chunk in writer.deltas(index, delta.text, delta.logprobs):
                yield _sse(chunk)
        assert gen.result is not None
        for chunk in writer.last():
            yield _sse(chunk)
        audit_error = await _finish_or_error(gen, 200, None)
        completed = True
        if audit_error is not None:
            yield _sse(error_body(audit_error))
            return
        if gen.command.include_usage:
            yield _sse(writer.usage(gen.result))
        yield b"data: [DONE]\n\n"
    except GatewayError as err:
        completed = True
        audit_error = await _finish_or_error(gen, STATUS[err.kind], err)
        yield _sse(error_body(audit_error or err))
    finally:
        gen.cancel()
        if not completed:
            gen.finish_detached(499)


# The OpenAI routes document their body with DeferredBody and get it undecoded (``data``):
# the principal is checked first and every refusal, a bad body too, is audited.


@post(
    "/v1/chat/completions",
    status_code=200,
    summary="Create a chat completion",
    dto=DeferredBody[ChatCompletionRequest],
    return_dto=None,
)
async def chat_completions(request: Request[Any, Any, Any], data: bytes = b"") -> Response[Any]:
    return await _serve(request, "chat.completions", ChatCompletionRequest)


@post(
    "/v1/completions",
    status_code=200,
    summary="Create a completion (legacy)",
    dto=DeferredBody[CompletionRequest],
    return_dto=None,
)
async def completions(request: Request[Any, Any, Any], data: bytes = b"") -> Response[Any]:
    return await _serve(request, "completions", CompletionRequest)


@get("/v1/models", summary="List the served models")
async def list_models(request: Request[Any, Any, Any]) -> dict[str, Any]:
    svc = services(request)
    await svc.auth.principal(request.headers.get("authorization"))
    data = [
        {"id": name, "object": "model", "created": 0, "owned_by": "gateway"}
        for name in svc.pool.target_names()
    ]
    return {"object": "list", "data": data}


@post(
    "/tokenize",
    status_code=200,
    summary="Tokenize a prompt (vLLM's convention)",
    dto=DeferredBody[TokenizeRequest],
    return_dto=None,
)
async def tokenize(request: Request[Any, Any, Any], data: bytes = b"") -> dict[str, Any]:
    """A tenant key only, charged one request of the tenant's rate limit; tokenized in a
    helper thread like a generation's prompt (serving/prepare.py)."""
    svc = services(request)
    principal = await svc.auth.principal(request.headers.get("authorization"))
    if principal.role != "tenant" or principal.tenant_id is None:
        raise GatewayError("permission", "/tokenize needs a tenant key", code="forbidden")
    body = decode_body(data, TokenizeRequest)
    if (body.prompt is None) == (body.messages is None):
        raise invalid("send exactly one of prompt or messages", "prompt")
    _, engine = await svc.pool.target(body.model)
    cmd = convert.tokenize_command(body)
    await admit_tokenize(svc.limiter, svc.policy, principal.tenant_id)
    _, ids = await tokenize_off_loop(engine.tokenizer, cmd, principal.tenant_id)
    return {"tokens": list(ids), "count": len(ids), "max_model_len": engine.context_length}


ROUTES = [chat_completions, completions, list_models, tokenize]
