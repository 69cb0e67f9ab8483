"""Admin API (admin key only): tenants, keys, policies, models and rollouts.

Every route sits behind the `admin_only` guard, which Litestar runs before it reads a body;
a body is the handler's typed ``data``, decoded by `bodies.JsonBody` (OpenAI-shaped 400s)."""

from __future__ import annotations

from typing import Annotated, Any

from litestar import Request, Response, Router, delete, get, post, put
from litestar.connection import ASGIConnection
from litestar.handlers import BaseRouteHandler
from litestar.params import Body

from gateway.http.admin_schemas import POLICY_DOCUMENT, ModelRegister, PolicyResolve, RolloutStart
from gateway.http.bodies import JsonBody, require_body, sent
from gateway.http.schemas import KeyCreate, TenantCreate
from gateway.serving import Services
from gateway.serving.errors import invalid


def _svc(connection: ASGIConnection[Any, Any, Any, Any]) -> Services:
    return connection.app.state.services  # type: ignore[no-any-return]


async def admin_only(connection: ASGIConnection[Any, Any, Any, Any], _: BaseRouteHandler) -> None:
    """Guard: the admin key, checked before the body is read (401/403 before any 400)."""
    await _svc(connection).auth.admin(connection.headers.get("authorization"))


# -- tenants and keys ---------------------------------------------------------------------


@post("/admin/tenants", status_code=201, summary="Create a tenant (409 if it exists)")
async def create_tenant(request: Request[Any, Any, Any], data: TenantCreate) -> dict[str, Any]:
    return await _svc(request).admin.create_tenant(data.id, data.name)


@get("/admin/tenants", summary="List tenants")
async def list_tenants(request: Request[Any, Any, Any]) -> dict[str, Any]:
    return {"data": await _svc(request).admin.list_tenants()}


@post(
    "/admin/tenants/{tenant_id:str}/keys",
    status_code=201,
    summary="Issue a tenant or auditor key (shown once)",
)
async def create_key(
    request: Request[Any, Any, Any], tenant_id: str, data: KeyCreate
) -> dict[str, Any]:
    return await _svc(request).admin.create_key(tenant_id, data.role)


@delete("/admin/keys/{key_id:str}", status_code=200, summary="Revoke a key")
async def revoke_key(request: Request[Any, Any, Any], key_id: str) -> dict[str, Any]:
    return await _svc(request).admin.revoke_key(key_id)


# -- policies -----------------------------------------------------------------------------


@get("/admin/policies", summary="The active policy bundle and its revision")
async def get_policies(request: Request[Any, Any, Any]) -> dict[str, Any]:
    return _svc(request).policy.describe()


@put("/admin/policies/tenants/{tenant_id:str}", summary="Replace one tenant's policy document")
async def put_tenant_policy(
    request: Request[Any, Any, Any],
    tenant_id: str,
    data: Annotated[dict[str, Any], Body(description=POLICY_DOCUMENT)],
) -> dict[str, Any]:
    return await _svc(request).policy.put_tenant(tenant_id, data, actor="admin")


@post("/admin/policies/resolve", status_code=200, summary="Dry run: the decision a request gets")
async def resolve_policy(request: Request[Any, Any, Any], data: PolicyResolve) -> dict[str, Any]:
    svc = _svc(request)
    return await svc.policy.resolve(sent(data), svc.worker.depth)


@post("/admin/policies/reload", status_code=200, summary="Reload the policy files on disk")
async def reload_policies(request: Request[Any, Any, Any]) -> dict[str, Any]:
    return await _svc(request).policy.reload(actor="admin")


# -- models and rollouts ------------------------------------------------------------------


@get("/admin/models", summary="Registered targets and drafts")
async def list_models(request: Request[Any, Any, Any]) -> dict[str, Any]:
    return {"data": await _svc(request).rollouts.models()}


@post("/admin/models", status_code=201, summary="Register a model version from a local dir")
async def register_model(request: Request[Any, Any, Any], data: ModelRegister) -> dict[str, Any]:
    return await _svc(request).rollouts.register(sent(data), actor="admin")


@post("/admin/rollouts", status_code=201, summary="Start a draft rollout (canary)")
async def start_rollout(request: Request[Any, Any, Any], data: RolloutStart) -> dict[str, Any]:
    return await _svc(request).rollouts.start_rollout(sent(data), actor="admin")


@get("/admin/rollouts", summary="Rollouts with live canary vs baseline stats")
async def list_rollouts(request: Request[Any, Any, Any]) -> dict[str, Any]:
    return {"data": await _svc(request).rollouts.list()}


@get("/admin/rollouts/{rollout_id:str}", summary="One rollout")
async def get_rollout(request: Request[Any, Any, Any], rollout_id: str) -> dict[str, Any]:
    return await _svc(request).rollouts.get(rollout_id)


@post(
    "/admin/rollouts/{rollout_id:str}/{action:str}",
    status_code=200,
    summary="promote | pause | rollback a rollout",
)
async def act_rollout(
    request: Request[Any, Any, Any], rollout_id: str, action: str
) -> Response[Any]:
    svc = _svc(request)
    if action not in ("promote", "pause", "rollback", "resume"):
        raise invalid(f"unknown rollout action '{action}' (promote, pause, rollback, resume)")
    return Response(await svc.rollouts.act(rollout_id, action, actor="admin"))


HANDLERS = [
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
ROUTES = [
    Router(
        "/",
        route_handlers=HANDLERS,
        guards=[admin_only],
        dto=JsonBody,
        return_dto=None,
        before_request=require_body,
    )
]
