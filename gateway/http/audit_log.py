"""The verifiable log's API: signed checkpoints, inclusion and consistency proofs, the log
export for the offline verifier, and the witness endpoint (docs/audit.md, "The verifiable
log").

Checkpoints and proofs reveal sizes and hashes only, so a tenant auditor key reads them too;
its proofs and exports are of its own tenant's records. The witness endpoint needs no key:
the log's signature on the checkpoint is what it checks.
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

from litestar import Request, Response, get, post
from litestar.response import Stream

from gateway.database import AuditLog
from gateway.database.audit.log_export import export_log, export_tenant
from gateway.database.audit.log_verify import verify_log
from gateway.database.audit.queries import decode_cursor, encode_cursor
from gateway.database.audit.witness import WitnessRefusal, WitnessRequest
from gateway.http.audit import RecordId, _answered, _cursor, _limit, _svc, _who
from gateway.http.audit_query import Cursor, Limit, _query
from gateway.limits import INT64_MAX
from gateway.serving.errors import GatewayError, invalid

TreeSize = Annotated[
    str | None,
    _query("Size of the signed checkpoint to prove against (default the latest).", minimum=1),
]
Tenant = Annotated[str | None, _query("Only this tenant's rows, each with its inclusion proof.")]


def _size(raw: str | None, name: str) -> int | None:
    if raw is None:
        return None
    if not raw.isascii() or not raw.isdigit() or not 1 <= int(raw) <= INT64_MAX:
        raise invalid(f"{name} must be a positive integer", name)
    return int(raw)


def _not_found(exc: LookupError) -> GatewayError:
    return GatewayError("not_found", str(exc).strip("'\""), code="not_found")


@get("/audit/checkpoints", summary="Signed checkpoints of the audit log, newest first")
async def checkpoints(
    request: Request[Any, Any, Any], cursor: Cursor = None, limit: Limit = "100"
) -> dict[str, Any]:
    await _who(request)
    svc = _svc(request)
    log = AuditLog(svc.store)
    raw = _cursor(cursor)
    before = decode_cursor(raw, "desc") if raw else None
    size = _limit(limit)
    rows = await _answered(log.checkpoints(size, before))
    job = svc.checkpoints
    return {
        "data": rows,
        "next_cursor": encode_cursor(rows[-1]["id"], "desc") if len(rows) == size else None,
        "keys": await _answered(log.keys()),
        "signer": None if job is None else job.status.__dict__,
    }


@get(
    "/audit/checkpoints/notes",
    summary="Every signed checkpoint, oldest first, as the offline verifier's --checkpoints file",
    media_type="text/plain; charset=utf-8",
)
async def checkpoint_notes(request: Request[Any, Any, Any]) -> Response[str]:
    await _who(request)
    text = await _answered(AuditLog(_svc(request).store).cosigned_notes())
    return Response(text, media_type="text/plain; charset=utf-8")


@get("/audit/records/{record_id:int}/proof", summary="Inclusion proof of one audit record")
async def record_proof(
    request: Request[Any, Any, Any], record_id: RecordId, tree_size: TreeSize = None
) -> dict[str, Any]:
    who = await _who(request)
    store = _svc(request).store
    if (
        who.tenant_id is not None
        and await _answered(store.record(record_id, who.tenant_id)) is None
    ):
        raise GatewayError("not_found", f"no audit record {record_id}", code="not_found")
    try:
        return await _answered(
            AuditLog(store).inclusion("record", record_id, _size(tree_size, "tree_size"))
        )
    except LookupError as exc:
        raise _not_found(exc) from None


@get("/audit/proofs/consistency", summary="Consistency proof between two signed checkpoints")
async def consistency(
    request: Request[Any, Any, Any],
    first: Annotated[str, _query("Size of the older signed checkpoint.", minimum=1)],
    second: TreeSize = None,
) -> dict[str, Any]:
    await _who(request)
    older = _size(first, "first")
    assert older is not None
    try:
        return await _answered(
            AuditLog(_svc(request).store).consistency(older, _size(second, "second"))
        )
    except LookupError as exc:
        raise _not_found(exc) from None


@get(
    "/audit/log/export",
    summary="The audit log as JSON lines, for the offline verifier",
    media_type="application/x-ndjson",
)
async def log_export(request: Request[Any, Any, Any], tenant: Tenant = None) -> Stream:
    who = await _who(request)
    if who.tenant_id is not None:
        if tenant not in (None, who.tenant_id):
            raise GatewayError(
                "permission", "an auditor key reads its own tenant only", param="tenant",
                code="forbidden",
            )  # fmt: skip
        tenant = who.tenant_id
    log = AuditLog(_svc(request).store)
    lines = export_tenant(log, tenant) if tenant else export_log(log)
    return Stream(
        lines,
        media_type="application/x-ndjson",
        headers={"content-disposition": 'attachment; filename="audit-log.jsonl"'},
    )


@get("/audit/log/verify", summary="The stored log against its rows and signed checkpoints")
async def log_verify(request: Request[Any, Any, Any]) -> dict[str, Any]:
    who = await _who(request)
    if who.tenant_id is not None:
        raise GatewayError(
            "permission", "the whole log is checked by operators (admin, auditor) only",
            code="forbidden",
        )  # fmt: skip
    return await _answered(verify_log(AuditLog(_svc(request).store)))


@post(
    "/witness/add-checkpoint",
    summary="Witness: cosign a log's checkpoint if it extends the last one cosigned",
    status_code=200,
    include_in_schema=False,  # a C2SP tlog-witness protocol endpoint, not the gateway's API
)
async def add_checkpoint(request: Request[Any, Any, Any]) -> Response[str]:
    witness = _svc(request).witness
    if witness is None:
        raise GatewayError("not_found", "this gateway runs no witness", code="not_found")
    try:
        body = (await request.body()).decode("utf-8")
        request_ = WitnessRequest.parse(body)
        line = await asyncio.to_thread(witness.add_checkpoint, request_)  # fsyncs its state
    except UnicodeDecodeError:
        return Response("body is not UTF-8\n", status_code=400, media_type="text/plain")
    except WitnessRefusal as exc:
        if exc.status == 409:
            return Response(f"{exc.size}\n", status_code=409, media_type="text/x.tlog.size")
        return Response(f"{exc}\n", status_code=exc.status, media_type="text/plain")
    return Response(line, media_type="text/plain; charset=utf-8")


ROUTES = [
    checkpoints, checkpoint_notes, record_proof, consistency, log_export, log_verify,
    add_checkpoint,
]  # fmt: skip
