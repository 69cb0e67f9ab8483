"""OpenAI-compatible endpoints: /v1/models, /v1/chat/completions, /v1/completions, /tokenize."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Sequence
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
from gateway.serving.prepare import admit_tokenize, tokenize_off_loop
from gateway.serving.recorder import shutting_down
from gateway.serving.started import Generation


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
    if gen.aborted is not None:  # its admission record could not be written: no output
        await _finish_or_error(gen, STATUS[gen.aborted.kind], gen.aborted)
        return error_response(gen.aborted, headers)
    if cmd.stream:
        return Stream(_stream(gen), media_type="text/event-stream", headers=headers)
    try:
        results = await _collect(request, gen)
    except GatewayError as err:
        gen.cancel()
        await _finish_or_error(gen, STATUS[err.kind], err)
        return error_response(err, headers)
    except _ClientGone:  # nobody to answer: the runs stop at their next step, recorded 499
        gen.cancel()
        await _finish_or_error(gen, CLIENT_GONE, None)
        return Response(b"", status_code=CLIENT_GONE, headers=headers)
    except asyncio.CancelledError:  # the server ended this handler (shutdown)
        _finish_cancelled(gen)
        raise
    except Exception as exc:  # a failed forward, a bug: still recorded, its slot freed
        gen.cancel()
        err = _internal(request, exc)
        await _finish_or_error(gen, STATUS[err.kind], err)
        return error_response(err, headers)
    audit_error = await _finish_or_error(gen, 200, None)
    if audit_error is not None:
        return error_response(audit_error, headers)
    return Response(full_response(gen, results), headers=headers)


CLIENT_GONE = 499
"""The status recorded for a request whose client went away (nginx's convention)."""


class _ClientGone(Exception):
    """The client disconnected before its answer was ready."""


async def _client_gone(request: Request[Any, Any, Any]) -> None:
    """Return once the client has disconnected. The body has been read, so the server's next
    ASGI message for this request is ``http.disconnect``, sent when the connection closes
    (or, some servers, once the response is complete: then nobody is waiting for this)."""
    try:
        while (await request.receive())["type"] != "http.disconnect":
            pass
    except Exception:  # a server that cannot tell: never claim the client left
        await asyncio.Event().wait()


async def _collect(request: Request[Any, Any, Any], gen: Generation) -> list[Any]:
    """``gen.collect()``, raced against the client leaving (``_ClientGone``) and the request
    being ended from outside (``gen.aborted``, e.g. shutdown): a non-streamed request stops
    at the next step when nobody waits for it, as a stream does."""
    collect = asyncio.ensure_future(gen.collect())
    watchers = [
        asyncio.ensure_future(_client_gone(request)),
        asyncio.ensure_future(gen.aborted_event.wait()),
    ]
    try:
        await asyncio.wait([collect, *watchers], return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in watchers:
            task.cancel()
        if not collect.done():
            collect.cancel()  # leaves the engine's event streams: the runs are cancelled
            await asyncio.gather(collect, return_exceptions=True)
    if gen.aborted is not None:
        raise gen.aborted
    if not collect.cancelled():
        return collect.result()  # type: ignore[no-any-return]
    raise _ClientGone


def _finish_cancelled(gen: Generation) -> None:
    """A handler ended by cancellation: a client gone (499), or a shutdown's (503)."""
    gen.cancel()
    draining = gen.service.recorder.draining
    if draining is None:
        gen.finish_detached(CLIENT_GONE)
    else:
        err = gen.aborted or shutting_down(draining)
        gen.finish_detached(STATUS[err.kind], err)


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
    """SSE: chunks, the final chunk, usage (when asked), then [DONE]. The admission record
    was durable before the first chunk (``start``); the final record is written before the
    final usage chunk. A client that disconnects cancels the engine run at its next step
    and the record is written with status 499; a request ended by a shutdown ends with an
    error chunk (503, ``shutting_down``)."""
    writer = ChunkWriter(gen)
    completed = False
    try:
        for chunk in writer.first():
            yield _sse(chunk)
        async for index, delta in gen.deltas():
            for chunk in writer.deltas(index, delta.text, delta.logprobs):
                yield _sse(chunk)
        if gen.aborted is not None:
            raise gen.aborted
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
            _finish_cancelled(gen)


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
    _, ticket = await admit_tokenize(svc.limiter, svc.policy, principal.tenant_id)
    ids: Sequence[int] = ()
    try:
        _, ids = await tokenize_off_loop(engine.tokenizer, cmd, principal.tenant_id)
    finally:  # its tokens count against the tenant's tokens/min
        await svc.limiter.settle(ticket, len(ids))
    return {"tokens": list(ids), "count": len(ids), "max_model_len": engine.context_length}


ROUTES = [chat_completions, completions, list_models, tokenize]
