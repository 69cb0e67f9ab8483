"""The gateway's database: append-only, hash-chained audit log plus operational tables.

Public API (the service layer codes against these names)::

    store = await AuditStore.connect(url, upgrade=False)   # any SQLAlchemy async URL
    ids = await store.append([(RequestRecord(...), Payload(...) | None), ...])
    await store.append_admin(AdminEvent(actor, action, subject, before, after))
    await store.verify()        # {"ok", "checked", "first_broken", "head",
                                #  "records_ok", "admin_events": {...}, "payloads": {...}}
    await store.records(RecordFilter(...), cursor, limit, oldest_first=False)
    await store.record(id, tenant_id=None)           # tenant scoping; includes "payload"
    async for line in store.export(RecordFilter(...), "jsonl" | "csv"): ...
    await store.summary(RecordFilter(...))
    await store.events(since, until, cursor, limit, action=None)
    await store.purge_payloads(now=None)
    # tenants, keys, policies (gateway.audit.accounts)
    create_tenant(id, name, *, actor) / get_tenant(id) / list_tenants()
    create_key(tenant_id, role, *, actor) -> (key_id, "sk-...") / revoke_key(key_id, *, actor)
    lookup_key(plaintext) -> KeyInfo | None / list_keys(tenant_id=None)
    put_policy(tenant_id, document, revision=None, *, actor) / active_policy(tenant_id)
    list_policies(tenant_id=None)
    # acceptance history, models, rollouts (gateway.audit.registry)
    put_acceptance(tenant_id, proposer, draft_version, *, ewma_acceptance, ewma_c, samples)
    get_acceptance(tenant_id, proposer, draft_version) / list_acceptance(tenant_id=None)
    register_model(name, version, *, role, path, sha256, target, status, actor)
    get_model(name, version) / list_models(name, role) / set_model_status(name, version, status)
    create_rollout(*, target, draft, version, baseline_version, canary_percent, sticky, guard,
                   state, reason, actor) / update_rollout(id, *, actor, **changes)
    get_rollout(id) / list_rollouts(*, target, draft, state)

    writer = AuditWriter(store, max_batch=64, max_delay_ms=5)
    await writer.start(); rid = await writer.write(record, payload); await writer.stop()

Compliance reads (records/record/events/export) return JSON-ready dicts (datetimes as
``YYYY-MM-DDTHH:MM:SS.ffffffZ``); CRUD reads return dicts with aware UTC datetimes.
Hash chain: :mod:`gateway.audit.chain`. Migrations: :mod:`gateway.audit.migrate`.
CLI: ``python -m gateway.audit {export,verify,summary,purge,upgrade}``.
"""

from gateway.audit.chain import format_datetime
from gateway.audit.store import AuditStore
from gateway.audit.types import (
    AdminEvent,
    AuditUnavailable,
    KeyInfo,
    Payload,
    RecordFilter,
    RequestRecord,
    TenantExists,
    WriterStats,
    sha256_text,
)
from gateway.audit.writer import AuditWriter

__all__ = [
    "AdminEvent",
    "AuditStore",
    "AuditUnavailable",
    "AuditWriter",
    "KeyInfo",
    "Payload",
    "RecordFilter",
    "RequestRecord",
    "TenantExists",
    "WriterStats",
    "format_datetime",
    "sha256_text",
]
