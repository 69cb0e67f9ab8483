"""The gateway's database: the append-only, hash-chained audit log (gateway.database.audit)
and the operational tables: accounts (tenants, keys, policies), rollouts (model versions,
draft rollouts) and the acceptance history.

Public API (the service layer codes against these names)::

    store = await Database.connect(url, upgrade=False)   # any SQLAlchemy async URL
    ids = await store.append([(RequestRecord(...), Payload(...) | None), ...])
    ids = await store.append([(Admission(...), None)])   # before the first output byte
    await store.incomplete_admissions(limit, tenant_id)  # admitted, no final record
    await store.append_admin(AdminEvent(actor, action, subject, before, after))
    await store.verify()        # {"ok", "checked", "first_broken", "head", "records_ok",
                                #  "admin_events", "admissions", "payloads", "incomplete"}
    await store.records(RecordFilter(...), cursor, limit, oldest_first=False)
    await store.record(id, tenant_id=None)           # tenant scoping; includes "payload"
    async for line in store.export(RecordFilter(...), "jsonl" | "csv"): ...
    await store.summary(RecordFilter(...))
    await store.events(since, until, cursor, limit, action=None)
    await store.purge_payloads(now=None)
    # tenants, keys, policies (gateway.database.accounts)
    create_tenant(id, name, *, actor) / get_tenant(id) / list_tenants()
    create_key(tenant_id, role, *, actor) -> (key_id, "sk-...") / revoke_key(key_id, *, actor)
    lookup_key(plaintext) -> KeyInfo | None / list_keys(tenant_id=None)
    put_policy(tenant_id, document, revision=None, *, actor) / active_policy(tenant_id)
    list_policies(tenant_id=None)
    # named operators and keys (gateway.database.operators)
    create_principal(name, role, *, actor, expires_at) -> (row, key_id, "sk-...")
    create_operator_key(name, *, actor, expires_at) / list_principals() / get_principal(name)
    disable_principal(name, *, actor) / rotate_key(key_id, grace, *, actor, expires_at)
    touch_key(key_id, last_used_at)
    # acceptance history (gateway.database.history); models, rollouts (gateway.database.rollouts)
    put_acceptance(tenant_id, proposer, draft_version, *, ewma_acceptance, ewma_c, samples)
    put_acceptances([(tenant_id, proposer, draft_version, acceptance, c, samples), ...])
    get_acceptance(tenant_id, proposer, draft_version) / list_acceptance(tenant_id=None)
    register_model(NewModelVersion(name=, version=, role=, path=, sha256=, ...), *, actor)
    get_model(name, version) / list_models(name, role) / set_model_status(name, version, status)
    create_rollout(NewRollout(target=, draft=, version=, ...), *, actor)
    update_rollout(id, *, actor, **changes)
    get_rollout(id) / list_rollouts(*, target, draft, state)
    update_rollout(id, *, actor, expect_state=...) (compare-and-set)
    add_rollout_sample(rollout_id, arm, ...) / rollout_samples(rollout_id, arm, window)

    # the verifiable log over the chains (gateway.database.audit.log): Merkle tree, signed
    # checkpoints (C2SP tlog-checkpoint, Ed25519), inclusion and consistency proofs
    log = AuditLog(store, Signer.parse("PRIVATE+KEY+..."))
    await log.checkpoint() / log.checkpoints() / log.inclusion(kind, id) / log.consistency(a, b)

    writer = AuditWriter(store, max_batch=64, max_delay_ms=5)
    await writer.start(); rid = await writer.write(record, payload); await writer.stop()

Compliance reads (records/record/events/export) return JSON-ready dicts (datetimes as
``YYYY-MM-DDTHH:MM:SS.ffffffZ``); CRUD reads return dicts with aware UTC datetimes.
Hash chain: :mod:`gateway.database.audit.chain`. Migrations: :mod:`gateway.database.migrate`.
CLI: ``python -m gateway.database {export,verify,summary,purge,upgrade,keygen,checkpoint,
export-log,checkpoints,verify-export}``.
"""

from gateway.database.audit.chain import format_datetime
from gateway.database.audit.log import AuditLog
from gateway.database.audit.log_sign import LogBroken
from gateway.database.audit.note import Signer, Verifier
from gateway.database.audit.types import (
    OPERATOR_ROLES,
    AdminEvent,
    Admission,
    AuditUnavailable,
    KeyInfo,
    Payload,
    RecordFilter,
    RequestRecord,
    TenantExists,
    WriterStats,
    sha256_text,
)
from gateway.database.audit.writer import AuditWriter
from gateway.database.operators import PrincipalExists
from gateway.database.store import Database

__all__ = [
    "OPERATOR_ROLES",
    "AdminEvent",
    "Admission",
    "AuditLog",
    "AuditUnavailable",
    "AuditWriter",
    "Database",
    "KeyInfo",
    "LogBroken",
    "Payload",
    "PrincipalExists",
    "RecordFilter",
    "RequestRecord",
    "Signer",
    "TenantExists",
    "Verifier",
    "WriterStats",
    "format_datetime",
    "sha256_text",
]
