"""Admin API (admin key only): tenants, keys, policies, models and rollouts."""

from __future__ import annotations

from typing import Any

from litestar import Request, Response, delete, get, post, put

from gateway.http.schemas import BodyError, KeyCreate, TenantCreate, decode
from gateway.serving import Services
from gateway.serving.errors import invalid


def _svc(request: Request[Any, Any, Any]) -> Services:
    return request.app.state.services  # type: ignore[no-any-return]


async def _admin(request: Request[Any, Any, Any]) -> Services:
    svc = _svc(request)
    await svc.auth.admin(request.headers.get("authorization"))
    return svc


async def _body(request: Request[Any, Any, Any], kind: type[Any]) -> Any:
    try:
        return decode(await request.body(), kind)
    except BodyError as exc:
        raise invalid(exc.message, exc.param) from None


async def _json(request: Request[Any, Any, Any]) -> dict[str, Any]:
    body = await _body(request, dict)
    return body  # type: ignore[no-any-return]


# -- tenants and keys ---------------------------------------------------------------------


@post("/admin/tenants", status_code=201, summary="Create a tenant (409 if it exists)")
async def create_tenant(request: Request[Any, Any, Any]) -> dict[str, Any]:
    svc = await _admin(request)
    body = await _body(request, TenantCreate)
    return await svc.admin.create_tenant(body.id, body.name)


@get("/admin/tenants", summary="List tenants")
async def list_tenants(request: Request[Any, Any, Any]) -> dict[str, Any]:
    svc = await _admin(request)
    return {"data": await svc.admin.list_tenants()}


@post(
    "/admin/tenants/{tenant_id:str}/keys",
    status_code=201,
    summary="Issue a tenant or auditor key (shown once)",
)
async def create_key(request: Request[Any, Any, Any], tenant_id: str) -> dict[str, Any]:
    svc = await _admin(request)
    body = await _body(request, KeyCreate)
    return await svc.admin.create_key(tenant_id, body.role)


@delete("/admin/keys/{key_id:str}", status_code=200, summary="Revoke a key")
async def revoke_key(request: Request[Any, Any, Any], key_id: str) -> dict[str, Any]:
    svc = await _admin(request)
    return await svc.admin.revoke_key(key_id)


# -- policies -----------------------------------------------------------------------------


@get("/admin/policies", summary="The active policy bundle and its revision")
async def get_policies(request: Request[Any, Any, Any]) -> dict[str, Any]:
    svc = await _admin(request)
    return svc.policy.describe()


@put("/admin/policies/tenants/{tenant_id:str}", summary="Replace one tenant's policy document")
async def put_tenant_policy(request: Request[Any, Any, Any], tenant_id: str) -> dict[str, Any]:
    svc = await _admin(request)
    return await svc.policy.put_tenant(tenant_id, await _json(request), actor="admin")


@post("/admin/policies/resolve", status_code=200, summary="Dry run: the decision a request gets")
async def resolve_policy(request: Request[Any, Any, Any]) -> dict[str, Any]:
    svc = await _admin(request)
    body = await _json(request)
    return await svc.policy.resolve(body, svc.worker.depth)


@post("/admin/policies/reload", status_code=200, summary="Reload the policy files on disk")
async def reload_policies(request: Request[Any, Any, Any]) -> dict[str, Any]:
    svc = await _admin(request)
    return await svc.policy.reload(actor="admin")


# -- models and rollouts ------------------------------------------------------------------


@get("/admin/models", summary="Registered targets and drafts")
async def list_models(request: Request[Any, Any, Any]) -> dict[str, Any]:
    svc = await _admin(request)
    return {"data": await svc.rollouts.models()}


@post("/admin/models", status_code=201, summary="Register a model version from a local dir")
async def register_model(request: Request[Any, Any, Any]) -> dict[str, Any]:
    svc = await _admin(request)
    return await svc.rollouts.register(await _json(request), actor="admin")


@post("/admin/rollouts", status_code=201, summary="Start a draft rollout (canary)")
async def start_rollout(request: Request[Any, Any, Any]) -> dict[str, Any]:
    svc = await _admin(request)
    return await svc.rollouts.start_rollout(await _json(request), actor="admin")


@get("/admin/rollouts", summary="Rollouts with live canary vs baseline stats")
async def list_rollouts(request: Request[Any, Any, Any]) -> dict[str, Any]:
    svc = await _admin(request)
    return {"data": await svc.rollouts.list()}


@get("/admin/rollouts/{rollout_id:str}", summary="One rollout")
async def get_rollout(request: Request[Any, Any, Any], rollout_id: str) -> dict[str, Any]:
    svc = await _admin(request)
    return await svc.rollouts.get(rollout_id)


@post(
    "/admin/rollouts/{rollout_id:str}/{action:str}",
    status_code=200,
    summary="promote | pause | rollback a rollout",
)
async def act_rollout(
    request: Request[Any, Any, Any], rollout_id: str, action: str
) -> Response[Any]:
    svc = await _admin(request)
    if action not in ("promote", "pause", "rollback", "resume"):
        raise invalid(f"unknown rollout action '{action}' (promote, pause, rollback, resume)")
    return Response(await svc.rollouts.act(rollout_id, action, actor="admin"))


ROUTES = [
    create_tenant,
    list_tenants,
    create_key,
    revoke_key,
    get_policies,
    put_tenant_policy,
    resolve_policy,
    reload_policies,
    list_models,
    register_model,
    start_rollout,
    list_rollouts,
    get_rollout,
    act_rollout,
]
