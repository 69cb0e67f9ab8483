"""Draft registry and rollouts as use cases (filled in by the rollout work)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gateway.audit import AuditStore
from gateway.serving.errors import GatewayError
from gateway.serving.models import ModelPool
from gateway.serving.recorder import Recorder
from gateway.serving.worker import InferenceWorker


class RolloutService:
    def __init__(
        self, store: AuditStore, pool: ModelPool, worker: InferenceWorker, recorder: Recorder
    ) -> None:
        self.store = store
        self.pool = pool
        self.worker = worker
        self.recorder = recorder

    async def start(self) -> None:
        return None

    def choose(
        self, target: str, request_id: str, tenant: str, allows: Callable[[str], bool]
    ) -> str | None:
        return None

    async def models(self) -> list[dict[str, Any]]:
        return [
            {
                "name": e.name,
                "version": e.version,
                "role": e.role,
                "target": e.target,
                "sha256": e.sha256,
                "status": "active",
            }
            for e in self.pool.manifest.entries
        ]

    async def register(self, body: dict[str, Any], actor: str) -> dict[str, Any]:
        raise GatewayError("invalid_request", "model registration is not available yet")

    async def start_rollout(self, body: dict[str, Any], actor: str) -> dict[str, Any]:
        raise GatewayError("invalid_request", "rollouts are not available yet")

    async def list(self) -> list[dict[str, Any]]:
        return []

    async def get(self, rollout_id: str) -> dict[str, Any]:
        raise GatewayError("not_found", f"no rollout {rollout_id}")

    async def act(self, rollout_id: str, action: str, actor: str) -> dict[str, Any]:
        raise GatewayError("not_found", f"no rollout {rollout_id}")
