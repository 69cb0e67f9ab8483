"""Use cases with no HTTP: build the services, run requests, shut down cleanly."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from pathlib import Path

from gateway.database import AuditWriter, Database
from gateway.engine import init_torch_thread
from gateway.serving.admin import AdminService
from gateway.serving.auth import Authenticator, bootstrap_admin_hash
from gateway.serving.decisions import PolicyService
from gateway.serving.generation import GenerationService
from gateway.serving.models import ModelPool
from gateway.serving.ratelimit import Limits, RateLimiter
from gateway.serving.recorder import Recorder
from gateway.serving.rollouts import RolloutAdmin, RolloutTraffic, RolloutView
from gateway.serving.tracing import Tracing
from gateway.serving.worker import InferenceWorker
from gateway.settings import Settings

log = logging.getLogger("gateway")


@dataclass
class Services:
    settings: Settings
    store: Database
    writer: AuditWriter
    pool: ModelPool
    worker: InferenceWorker
    policy: PolicyService
    recorder: Recorder
    generation: GenerationService
    auth: Authenticator
    admin: AdminService
    rollouts: RolloutAdmin
    traffic: RolloutTraffic
    tracing: Tracing

    async def readiness(self) -> dict[str, bool]:
        try:
            await self.store.list_tenants()
            db = True
        except Exception:
            db = False
        return {
            "database": db,
            "models": bool(self.pool.target_names()),
            "worker": self.worker.depth < self.worker.capacity + self.worker.max_active,
        }

    async def close(self) -> None:
        """Finish what was accepted: the worker's jobs, background writes, then the store."""
        await asyncio.to_thread(self.worker.stop)
        await self.recorder.drain()
        await self.policy.stop()
        await self.writer.stop()
        await self.store.close()


async def build_services(settings: Settings, tracing: Tracing | None = None) -> Services:
    """``tracing``: the spans to make (default none, see serving/tracing.py)."""
    tracing = tracing or Tracing(None)
    Path(settings.var_dir).mkdir(parents=True, exist_ok=True)
    store = await Database.connect(settings.database_url, upgrade=settings.migrate_on_start)
    tracing.instrument_database(store.engine.sync_engine)
    writer = AuditWriter(store)
    await writer.start()
    # The worker's thread is the only one that touches torch: it loads the models too.
    worker = InferenceWorker(
        settings.queue_capacity,
        settings.max_active,
        on_start=lambda: init_torch_thread(settings.torch_threads),
        max_batch=settings.max_batch,
        kv_budget_tokens=settings.kv_budget_tokens,
    )
    worker.start()
    pool = ModelPool.from_manifest(
        settings.models, settings.device, settings.dtype, worker.call,
        probe_rows=settings.max_batch if settings.measure_costs else 0,
    )  # fmt: skip
    await pool.load_targets()
    recorder = Recorder(writer, fail_closed=settings.audit_fail_closed)
    view = RolloutView(store, pool, recorder.detach)
    traffic = RolloutTraffic(view)
    rollouts = RolloutAdmin(view, traffic, worker)
    await rollouts.start()
    limits = Limits(settings.default_requests_per_minute, settings.default_tokens_per_minute)
    policy = PolicyService(store, settings.policies, limits, choose_draft=traffic.choose)
    await policy.start()
    generation = GenerationService(
        pool=pool, worker=worker, policy=policy, traffic=traffic, limiter=RateLimiter(),
        recorder=recorder, tracing=tracing,
    )  # fmt: skip
    auth = Authenticator(store, bootstrap_admin_hash(settings.admin_key, settings.var_dir))
    return Services(
        settings=settings,
        store=store,
        writer=writer,
        pool=pool,
        worker=worker,
        policy=policy,
        recorder=recorder,
        generation=generation,
        auth=auth,
        admin=AdminService(store),
        rollouts=rollouts,
        traffic=traffic,
        tracing=tracing,
    )
