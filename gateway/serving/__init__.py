"""Use cases with no HTTP: build the services, run requests, shut down cleanly."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from gateway.database import AuditWriter, Database
from gateway.database.audit.witness import Witness
from gateway.database.base import Timeouts
from gateway.engine import default_device, init_torch_thread, serving_threads
from gateway.serving.admin import AdminService
from gateway.serving.auth import Authenticator, bootstrap_admin_hash
from gateway.serving.checkpoint_s3 import S3LockOptions, S3LockSink
from gateway.serving.checkpoints import (
    CheckpointJob,
    CheckpointOptions,
    make_witness,
    start_checkpoints,
)
from gateway.serving.cost_store import CostStore
from gateway.serving.decisions import PolicyService
from gateway.serving.generation import GenerationService, Pipeline
from gateway.serving.models import ModelPool, PoolOptions
from gateway.serving.oidc import OidcConfig, OidcVerifier
from gateway.serving.ratelimit import Limiter, Limits, RateLimiter
from gateway.serving.ratelimit_redis import RedisRateLimiter
from gateway.serving.recorder import Recorder
from gateway.serving.retention import RetentionJob, start_retention
from gateway.serving.rollouts import RolloutAdmin, RolloutTraffic, RolloutView
from gateway.serving.tracing import Tracing
from gateway.serving.worker import InferenceWorker, WorkerOptions, batch_rows
from gateway.settings import Settings
from gateway.speed import keep_verdicts
from gateway.speed.kept_parity import KeptParity

T = TypeVar("T")

log = logging.getLogger("gateway")
SYNC_S = 2.0
"""How often each replica re-reads what other replicas change in the shared database
(tenant policy documents, registered model versions, rollouts), whether or not traffic
flows: a change made on one replica is in force on all within this plus one read."""


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
    limiter: Limiter
    tracing: Tracing
    sync_task: asyncio.Task[None] | None = None
    retention: RetentionJob | None = None
    """The scheduled payload purge (serving/retention.py); None when disabled."""
    checkpoints: CheckpointJob | None = None
    """The audit log's checkpoint job (serving/checkpoints.py); None when disabled."""
    witness: Witness | None = None
    """The witness this gateway runs for other logs (GATEWAY_WITNESS_KEY); None: none."""

    def start_sync(self) -> None:
        self.sync_task = asyncio.get_running_loop().create_task(self._sync_loop())

    async def _sync_loop(self) -> None:
        while True:
            await asyncio.sleep(SYNC_S)
            try:
                changed = await self.policy.refresh_policies()
                if changed:
                    log.info("policy documents changed elsewhere, now in force: %s", changed)
                added = await self.rollouts.adopt_registered()
                if added:
                    log.info("model versions registered elsewhere, now served: %s", added)
                await self.rollouts.view.refresh()
            except Exception as exc:  # the database may be down: keep serving what we have
                log.warning("sync with the shared database failed: %s", exc)

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
        """Finish what was accepted, for at most the shutdown grace (then what still runs is
        ended and recorded, ``Recorder.close_open``): the worker's jobs, background writes,
        then the store."""
        if self.sync_task is not None:
            self.sync_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.sync_task
        if self.retention is not None:
            await self.retention.stop()
        if self.checkpoints is not None:
            await self.checkpoints.stop()
        grace = self.settings.shutdown_grace_s
        await self.recorder.close_open(grace)  # drain, bounded; then end and record the rest
        await asyncio.to_thread(self.worker.stop, grace)
        await self.recorder.drain()
        await self.policy.stop()
        await self.writer.stop()
        await self.limiter.close()
        await self.store.close()


async def build_services(settings: Settings, tracing: Tracing | None = None) -> Services:
    """``tracing``: the spans to make (default none, see serving/tracing.py)."""
    tracing = tracing or Tracing(None)
    Path(settings.var_dir).mkdir(parents=True, exist_ok=True)
    store = await Database.connect(
        settings.database_url,
        upgrade=settings.migrate_on_start,
        timeouts=database_timeouts(settings),
    )
    tracing.instrument_database(store.engine.sync_engine)
    writer = AuditWriter(store)
    await writer.start()
    # The worker's thread is the only one that touches torch: it loads the models too.
    # Tokenizing on the event loop must not start a pool of its own either (the Rust
    # tokenizers' rayon pool, one thread per core, woken by every prompt); an operator's own
    # setting wins.
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    options = WorkerOptions(
        capacity=settings.queue_capacity,
        max_active=settings.max_active,
        max_batch=settings.max_batch,
        kv_budget_tokens=settings.kv_budget_tokens,
        prefill_chunk=settings.prefill_chunk,
        prefill_budget=settings.prefill_budget,
        fair_steps=_fair_steps(settings),
        preempt=settings.preempt,
    )
    worker = InferenceWorker(
        options, on_start=lambda: init_torch_thread(settings.torch_threads or serving_threads())
    )
    worker.start()
    compile_mode = _compile_mode(settings.compile)
    cpu_linear = _cpu_linear(settings.cpu_linear)  # None (auto): timed once, then kept
    keep_verdicts(Path(settings.var_dir) / "linear-verdicts.json" if cpu_linear is None else None)
    compile_store = None
    if compile_mode != "off":
        os.environ.setdefault(
            "TORCHINDUCTOR_CACHE_DIR", str(Path(settings.var_dir) / "compile-cache")
        )
        compile_store = Path(os.environ["TORCHINDUCTOR_CACHE_DIR"]) / "precompiled"

    def compile_rows(context: int) -> int:
        return batch_rows(settings.max_batch, settings.kv_budget_tokens, context)

    pool = ModelPool.from_manifest(
        settings.models,
        worker.call,
        PoolOptions(
            device=settings.device,
            dtype=settings.dtype,
            probe_rows=settings.max_batch if settings.measure_costs else 0,
            compile_rows=compile_rows,
            cpu_linear=cpu_linear,
            compile_mode=compile_mode,
            graphs_mode=_graphs_mode(settings.cuda_graphs),
            compile_store=compile_store,
            prefill_chunk=settings.prefill_chunk,
        ),
    )
    pool.verified = Path(settings.var_dir) / "verified-weights.json"
    pool.costs = CostStore(Path(settings.var_dir) / "forward-costs.json")
    pool.parity = KeptParity(Path(settings.var_dir) / "lean-parity.json")
    await pool.load_targets()
    recorder = Recorder(writer, fail_closed=settings.audit_fail_closed)
    view = RolloutView(store, pool, recorder.detach)
    traffic = RolloutTraffic(view)
    rollouts = RolloutAdmin(view, traffic, worker)
    await rollouts.start()
    limits = Limits(settings.default_requests_per_minute, settings.default_tokens_per_minute)
    policy = PolicyService(store, settings.policies, limits, choose_draft=traffic.choose)
    await policy.start()
    limiter = make_limiter(settings)
    pipeline = Pipeline(
        pool=pool,
        worker=worker,
        policy=policy,
        traffic=traffic,
        limiter=limiter,
        recorder=recorder,
        tracing=tracing,
    )
    generation = GenerationService(pipeline, prefix_cache=settings.prefix_cache)
    auth = Authenticator(
        store, bootstrap_admin_hash(settings.admin_key, settings.var_dir), make_oidc(settings)
    )
    services = Services(
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
        limiter=limiter,
        tracing=tracing,
    )
    services.start_sync()
    services.retention = start_retention(store, settings.retention_interval_s)
    services.checkpoints = start_checkpoints(
        store, checkpoint_options(settings), more=make_s3_sink(settings)
    )
    services.witness = make_witness(settings.witness_key, settings.witness_logs, settings.var_dir)
    return services


def database_timeouts(settings: Settings) -> Timeouts:
    """The PostgreSQL session limits of GATEWAY_DATABASE_*_TIMEOUT_MS."""
    return Timeouts(
        lock_ms=settings.database_lock_timeout_ms,
        statement_ms=settings.database_statement_timeout_ms,
        idle_in_transaction_ms=settings.database_idle_in_transaction_timeout_ms,
    )


def checkpoint_options(settings: Settings) -> CheckpointOptions:
    """The checkpoint job's GATEWAY_AUDIT_* settings."""
    return CheckpointOptions(
        interval_s=settings.audit_checkpoint_interval_s,
        records=settings.audit_checkpoint_records,
        key=settings.audit_signing_key,
        origin=settings.audit_log_origin,
        var_dir=settings.var_dir,
        file=settings.audit_checkpoint_file,
        witness_url=settings.audit_witness_url,
        witness_vkey=settings.audit_witness_vkey,
    )


def make_s3_sink(settings: Settings) -> list[S3LockSink]:
    """The Object Lock sink of GATEWAY_AUDIT_S3_BUCKET (none unset); ValueError when its
    settings are wrong or boto3 is missing. Makes a client, reaches nothing."""
    if not settings.audit_s3_bucket:
        return []
    options = S3LockOptions(
        bucket=settings.audit_s3_bucket,
        prefix=settings.audit_s3_prefix,
        endpoint_url=settings.audit_s3_endpoint_url,
        retention_days=settings.audit_s3_retention_days,
        mode=settings.audit_s3_lock_mode,
    )
    return [S3LockSink(options)]


def make_oidc(settings: Settings) -> OidcVerifier | None:
    """Operators' identity-provider tokens when GATEWAY_OIDC_JWKS is set; ValueError when
    the settings are unsafe (no issuer or audience, a JWKS over plain http)."""
    if not settings.oidc_jwks:
        return None
    return OidcVerifier(
        OidcConfig(
            jwks=settings.oidc_jwks, issuer=settings.oidc_issuer,
            audience=settings.oidc_audience, role_claim=settings.oidc_role_claim,
            name_claim=settings.oidc_name_claim,
            allow_unchecked_claims=settings.oidc_allow_unchecked_claims,
        )
    )  # fmt: skip


def make_limiter(settings: Settings) -> Limiter:
    """Redis-shared limits when GATEWAY_REDIS_URL is set, else this process's own window."""
    if not settings.redis_url:
        return RateLimiter()
    return RedisRateLimiter(
        settings.redis_url, prefix=settings.redis_prefix, fail_closed=settings.redis_fail_closed
    )


def _compile_mode(value: str) -> str:
    """GATEWAY_COMPILE: off, on or auto (true/false: on/off)."""
    return _auto_on_off("GATEWAY_COMPILE", value, ("off", "on", "auto"))


def _fair_steps(settings: Settings) -> bool:
    """GATEWAY_FAIR_STEPS: on, off or auto (on unless the models run on CUDA)."""
    mode = _auto_on_off("GATEWAY_FAIR_STEPS", settings.fair_steps, ("off", "on", "auto"))
    if mode != "auto":
        return mode == "on"
    device = settings.device or str(default_device())
    return not device.startswith("cuda")


def _graphs_mode(value: str) -> str:
    """GATEWAY_CUDA_GRAPHS: off, on or auto (true/false: on/off)."""
    return _auto_on_off("GATEWAY_CUDA_GRAPHS", value, ("off", "on", "auto"))


def _cpu_linear(value: str) -> bool | None:
    """GATEWAY_CPU_LINEAR: auto (None: measured at load), on, off."""
    return _auto_on_off("GATEWAY_CPU_LINEAR", value, (False, True, None))


def _auto_on_off(name: str, value: str, meanings: tuple[T, T, T]) -> T:
    """What an off / on / auto setting means (true and false: on and off); any other value
    stops the start, naming the variable."""
    off, on, auto = meanings
    choices = {"off": off, "false": off, "on": on, "true": on, "auto": auto}
    key = value.strip().lower()
    if key not in choices:
        raise ValueError(f"{name} must be off, on or auto, got {value!r}")
    return choices[key]
