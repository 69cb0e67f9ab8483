"""Admin API: tenants, keys, named operators, policies, models and rollouts.

Every route names the permission it needs (``opt["permission"]``); the `permitted` guard,
which Litestar runs before it reads a body, authenticates the caller, checks its role
(gateway.serving.auth.ROLE_PERMISSIONS) and keeps the principal for the handler, whose
admin events name it as actor. A body is the handler's typed ``data``, decoded by
`bodies.JsonBody` (OpenAI-shaped 400s)."""

from __future__ import annotations

from typing import Annotated, Any

from litestar import Request, Response, Router, delete, get, post, put
from litestar.connection import ASGIConnection
from litestar.handlers import BaseRouteHandler
from litestar.params import Body
from msgspec import UNSET

from gateway.http.admin_schemas import (
    POLICY_DOCUMENT,
    KeyRotate,
    ModelRegister,
    OperatorCreate,
    OperatorKeyCreate,
    PolicyResolve,
    RolloutStart,
)
from gateway.http.bodies import JsonBody, require_body, sent
from gateway.http.schemas import KeyCreate, TenantCreate
from gateway.serving import Services
from gateway.serving.auth import allows
from gateway.serving.commands import Principal
from gateway.serving.errors import GatewayError, invalid


def _svc(connection: ASGIConnection[Any, Any, Any, Any]) -> Services:
    return connection.app.state.services  # type: ignore[no-any-return]


def _actor(request: Request[Any, Any, Any]) -> str:
    return _who(request).actor


def _who(request: Request[Any, Any, Any]) -> Principal:
    return request.state.principal  # type: ignore[no-any-return]


async def permitted(
    connection: ASGIConnection[Any, Any, Any, Any], handler: BaseRouteHandler
) -> None:
    """Guard: the caller's role allows the route's permission (401/403 before any 400).
    ``self`` routes take any operator; the handler checks what it acts on."""
    auth, header = _svc(connection).auth, connection.headers.get("authorization")
    permission = handler.opt.get("permission", "operators.read")  # OPTIONS: as before, admin
    if permission == "self":
        p = await auth.principal(header)
        if p.name is None:
            raise GatewayError(
                "permission", "this endpoint needs an operator key", code="forbidden"
            )
    else:
        p = await auth.require(header, permission)
    connection.state.principal = p


# -- tenants and keys ---------------------------------------------------------------------


@post(
    "/admin/tenants",
    status_code=201,
    summary="Create a tenant (409 if it exists)",
    opt={"permission": "tenants.write"},
)
async def create_tenant(request: Request[Any, Any, Any], data: TenantCreate) -> dict[str, Any]:
    return await _svc(request).admin.create_tenant(data.id, data.name, _actor(request))


@get("/admin/tenants", summary="List tenants", opt={"permission": "tenants.read"})
async def list_tenants(request: Request[Any, Any, Any]) -> dict[str, Any]:
    return {"data": await _svc(request).admin.list_tenants()}


@post(
    "/admin/tenants/{tenant_id:str}/keys",
    status_code=201,
    summary="Issue a tenant or auditor key (shown once)",
    opt={"permission": "tenants.write"},
)
async def create_key(
    request: Request[Any, Any, Any], tenant_id: str, data: KeyCreate
) -> dict[str, Any]:
    return await _svc(request).admin.create_key(
        tenant_id, data.role, _actor(request), data.expires_in_s
    )


@delete(
    "/admin/keys/{key_id:str}",
    status_code=200,
    summary="Revoke a key",
    opt={"permission": "tenants.write"},
)
async def revoke_key(request: Request[Any, Any, Any], key_id: str) -> dict[str, Any]:
    return await _svc(request).admin.revoke_key(key_id, _actor(request))


# -- policies -----------------------------------------------------------------------------


@get(
    "/admin/policies",
    summary="The active policy bundle and its revision",
    opt={"permission": "policies.read"},
)
async def get_policies(request: Request[Any, Any, Any]) -> dict[str, Any]:
    return _svc(request).policy.describe()


@put(
    "/admin/policies/tenants/{tenant_id:str}",
    summary="Replace one tenant's policy document",
    opt={"permission": "policies.write"},
)
async def put_tenant_policy(
    request: Request[Any, Any, Any],
    tenant_id: str,
    data: Annotated[dict[str, Any], Body(description=POLICY_DOCUMENT)],
) -> dict[str, Any]:
    return await _svc(request).policy.put_tenant(tenant_id, data, actor=_actor(request))


@post(
    "/admin/policies/resolve",
    status_code=200,
    summary="Dry run: the decision a request gets",
    opt={"permission": "policies.read"},
)
async def resolve_policy(request: Request[Any, Any, Any], data: PolicyResolve) -> dict[str, Any]:
    svc = _svc(request)
    return await svc.policy.resolve(sent(data), svc.worker.depth)


@post(
    "/admin/policies/reload",
    status_code=200,
    summary="Reload the policy files on disk",
    opt={"permission": "policies.write"},
)
async def reload_policies(request: Request[Any, Any, Any]) -> dict[str, Any]:
    return await _svc(request).policy.reload(actor=_actor(request))


# -- models and rollouts ------------------------------------------------------------------


@get("/admin/models", summary="Registered targets and drafts", opt={"permission": "rollouts.read"})
async def list_models(request: Request[Any, Any, Any]) -> dict[str, Any]:
    return {"data": await _svc(request).rollouts.models()}


@post(
    "/admin/models",
    status_code=201,
    summary="Register a model version from a local dir",
    opt={"permission": "rollouts.write"},
)
async def register_model(request: Request[Any, Any, Any], data: ModelRegister) -> dict[str, Any]:
    return await _svc(request).rollouts.register(sent(data), actor=_actor(request))


@post(
    "/admin/rollouts",
    status_code=201,
    summary="Start a draft rollout (canary)",
    opt={"permission": "rollouts.write"},
)
async def start_rollout(request: Request[Any, Any, Any], data: RolloutStart) -> dict[str, Any]:
    return await _svc(request).rollouts.start_rollout(sent(data), actor=_actor(request))


@get(
    "/admin/rollouts",
    summary="Rollouts with live canary vs baseline stats",
    opt={"permission": "rollouts.read"},
)
async def list_rollouts(request: Request[Any, Any, Any]) -> dict[str, Any]:
    return {"data": await _svc(request).rollouts.list()}


@get("/admin/rollouts/{rollout_id:str}", summary="One rollout", opt={"permission": "rollouts.read"})
async def get_rollout(request: Request[Any, Any, Any], rollout_id: str) -> dict[str, Any]:
    return await _svc(request).rollouts.get(rollout_id)


@post(
    "/admin/rollouts/{rollout_id:str}/{action:str}",
    status_code=200,
    summary="promote | pause | rollback a rollout",
    opt={"permission": "rollouts.write"},
)
async def act_rollout(
    request: Request[Any, Any, Any], rollout_id: str, action: str
) -> Response[Any]:
    svc = _svc(request)
    if action not in ("promote", "pause", "rollback", "resume"):
        raise invalid(f"unknown rollout action '{action}' (promote, pause, rollback, resume)")
    return Response(await svc.rollouts.act(rollout_id, action, actor=_actor(request)))


# -- named operators and keys -------------------------------------------------------------


def _unset(value: Any) -> Any:
    return None if value is UNSET else value


@post(
    "/admin/operators",
    status_code=201,
    summary="Create a named operator with a role, and its first key (shown once)",
    opt={"permission": "operators.write"},
)
async def create_operator(request: Request[Any, Any, Any], data: OperatorCreate) -> dict[str, Any]:
    return await _svc(request).admin.create_operator(
        data.name, data.role, _actor(request), _unset(data.expires_in_s)
    )


@get(
    "/admin/operators",
    summary="Operators with their keys (id, created, last used, expiry; never the secret)",
    opt={"permission": "operators.read"},
)
async def list_operators(request: Request[Any, Any, Any]) -> dict[str, Any]:
    return {"data": await _svc(request).admin.list_operators()}


@post(
    "/admin/operators/{name:str}/keys",
    status_code=201,
    summary="Another key for an operator (shown once)",
    opt={"permission": "operators.write"},
)
async def create_operator_key(
    request: Request[Any, Any, Any], name: str, data: OperatorKeyCreate
) -> dict[str, Any]:
    return await _svc(request).admin.create_operator_key(
        name, _actor(request), _unset(data.expires_in_s)
    )


@delete(
    "/admin/operators/{name:str}",
    status_code=200,
    summary="Disable an operator and revoke its keys",
    opt={"permission": "operators.write"},
)
async def disable_operator(request: Request[Any, Any, Any], name: str) -> dict[str, Any]:
    return await _svc(request).admin.disable_operator(name, _actor(request))


@get(
    "/admin/keys",
    summary="Every key (tenant, auditor, operator) without its secret",
    opt={"permission": "operators.read"},
)
async def list_keys(request: Request[Any, Any, Any], tenant: str | None = None) -> dict[str, Any]:
    return {"data": await _svc(request).admin.list_keys(tenant)}


@post(
    "/admin/keys/{key_id:str}/rotate",
    status_code=201,
    summary="Rotate a key: a new key (shown once, expiring when the old one would); the old "
    "one lives for the grace period",
    opt={"permission": "self"},
)
async def rotate_key(
    request: Request[Any, Any, Any], key_id: str, data: KeyRotate
) -> dict[str, Any]:
    who = _who(request)
    if key_id != who.key_id and not allows(who, "operators.write"):
        raise GatewayError(
            "permission", "an operator may rotate its own key only", code="forbidden"
        )
    return await _svc(request).admin.rotate_key(
        key_id, data.grace_s, who.actor, _unset(data.expires_in_s)
    )


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
    create_operator,
    list_operators,
    create_operator_key,
    disable_operator,
    list_keys,
    rotate_key,
]
ROUTES = [
    Router(
        "/",
        route_handlers=HANDLERS,
        guards=[permitted],
        dto=JsonBody,
        return_dto=None,
        before_request=require_body,
    )
]
