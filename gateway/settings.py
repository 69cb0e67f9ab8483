"""Typed settings, read from the environment (GATEWAY_*), with documented defaults.

Every field below is one environment variable: the field name upper-cased with the
GATEWAY_ prefix (``port`` -> ``GATEWAY_PORT``). docs/configuration.md lists them too.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _default_models() -> str:
    return str(ROOT / "models_registry" / "demo" / "manifest.yaml")


@dataclass(frozen=True)
class Settings:
    host: str = "127.0.0.1"
    """Interface the HTTP server binds to."""
    port: int = 8000
    """TCP port of the HTTP server."""
    database_url: str = f"sqlite+aiosqlite:///{ROOT / 'var' / 'gateway.db'}"
    """Any SQLAlchemy async URL; PostgreSQL via postgresql+asyncpg://user@host/db. Unset,
    SQLite in ``var_dir`` (gateway.db)."""
    migrate_on_start: bool = True
    """Run Alembic upgrade head at start (production runs the migrate job instead)."""
    admin_key: str | None = None
    """Bootstrap admin bearer key. If unset, one is generated on first start, printed once
    and its hash kept in var/admin_key.sha256."""
    models: str = field(default_factory=_default_models)
    """Model manifest (YAML). Default: the bundled demo pair in models_registry/demo."""
    policies: str = str(ROOT / "policies" / "bundles")
    """Folder of policy bundles (default.yaml and tenants/*.yaml)."""
    device: str | None = None
    """torch device for the models (cuda, cpu); default CUDA when present, else CPU."""
    dtype: str | None = None
    """Model dtype (float32, bfloat16, float16); default fp32 on CPU, bf16 on CUDA."""
    queue_capacity: int = 32
    """Requests that may wait for the inference worker before 503 Overloaded."""
    max_active: int = 16
    """Requests the worker runs at once (batch rows of every target, plus admin jobs such
    as a promotion's regression gate); the others wait in the queue."""
    max_batch: int = 8
    """Rows of one target's continuous batch: requests that share every target forward.
    Each row reserves a KV slot of the target's full context length
    (see docs/batching-and-speed.md)."""
    prefill_chunk: int = 128
    """Prompt tokens one batch step prefills at most for one row: a long prompt enters the
    batch over several steps, so the rows already decoding wait one chunk per step, not a
    whole prompt. A row prefilling alone takes a rest of up to a quarter chunk with its
    last chunk (a forward of its own would cost more). Smaller: steadier inter-token
    latency for the others, a longer time to first token for the arrival. At least 1."""
    prefill_budget: int = 512
    """Prompt tokens one batch step prefills at most for all rows together (rows x longest
    chunk, padding included; at least prefill_chunk): arrivals that come together prefill
    in one forward, whose matrix products cost less per token than one row's. At least
    1."""
    kv_budget_tokens: int | None = None
    """KV cache budget of one target's batch, in tokens: its rows are capped at
    budget // context length (each row's slot holds a full context), at least 1; default
    no cap beyond max_batch. Arrivals past the rows wait in the queue."""
    measure_costs: bool = True
    """Time each model's forwards for batches of 1..max_batch rows when it loads (a few
    seconds on CPU), so that auto mode's cost model starts from measurements; the batch
    then keeps following its real forwards either way."""
    cpu_linear: str = "auto"
    """fp32 CPU nn.Linear layers: ``auto`` times both forwards at load and keeps the faster
    (gateway/engine/cpu_linear.py), ``on`` always uses the weight-major forward, ``off``
    keeps torch's. The timing takes about a second and, where the two are close, could pick
    differently from one start to the next, so auto keeps its verdict per model shape and
    machine in ``{var_dir}/linear-verdicts.json`` and the next start reads it instead of measuring
    (delete the file to measure again)."""
    compile: str = "off"
    """``off``, ``on`` or ``auto``: compile the batch path's decode steps with torch.compile
    (inductor) at start (gateway/engine/compiled.py; Llama, Mistral and Qwen2 families, the
    ones the lean decoder runs; others stay eager with a log line). Every manifest model
    then loads and compiles before the gateway says it is ready. ``auto`` then times each
    kind of step (one row x one token or several, several rows x one or several) compiled
    and eager on this device and serves compiled only the kinds where it measured at least
    3% faster (a model where none did runs eager; the log says which). A cold start compiles
    for about a minute on a small CPU; the compiled steps are saved (var/compile-cache unless
    TORCHINDUCTOR_CACHE_DIR is set: inductor's cache and precompiled/) and a restart loads
    them (docs/batching-and-speed.md, "Compiled step"; benchmarks/reports/compile_startup.json
    and engine_compiled.json have the measurements). Off by default because of the first
    start's time. A draft registered while the gateway runs
    stays eager. ``true``/``false`` mean on/off."""
    compile_helper: bool = True
    """With ``GATEWAY_COMPILE`` on or auto, models on the CPU and 2 cores or more: at a
    start where the first target has steps to compile, a helper process (``python -m
    gateway.engine.precompile``) compiles one kind of that target's step and the other
    models' missing steps (its drafts, any further target) meanwhile; the gateway compiles
    the target's other kinds, waits for the helper, then loads what it saved
    (gateway/engine/precompile.py). A helper that fails leaves
    what it did not save to the gateway, which compiles it as without a helper; one that
    runs past 30 minutes is killed. ``false``: every model compiles in the gateway, one
    after the other."""
    cuda_graphs: str = "off"
    """On a CUDA device: ``off``, ``on`` or ``auto``: pad the batch path's decode steps to
    buckets of rows x tokens x key span and replay them as captured CUDA graphs
    (gateway/engine/graphs.py; the families the lean decoder runs), each bucket recorded on
    its first step. ``auto`` times each kind of step captured and eager at start and keeps
    the kinds where replaying measured at least 3% faster. With ``GATEWAY_COMPILE`` on or
    auto the inductor-compiled step is what gets captured. A capture that fails turns the
    model's graphs off, with a log line. Ignored on CPU. Off by default until the prepared
    GPU check (benchmarks/cuda_check.sh) has run on a GPU: no GPU has run it yet.
    ``true``/``false`` mean on/off."""
    prefix_cache: bool = True
    """Keep the keys and values of finished requests' prompts (and outputs) in the batch's
    free slots, and let the same tenant's next request with the same beginning skip
    prefilling it (gateway/engine/batch/prefix.py): a chat's next turn, or a shared system
    prompt. Per tenant: another tenant never reuses them (its time to first token would
    tell what was sent). Reported as ``usage.prompt_tokens_details.cached_tokens`` and
    ``gateway_prompt_cached_tokens_total``. No memory beyond the batch's slots, which exist
    anyway. ``false``: every prompt is prefilled."""
    fair_steps: str = "auto"
    """``on``, ``off`` or ``auto``: each decoding step, the rows of a tenant that has been
    served more than its share (its weighted tokens lead the least of the tenants sharing
    the batch by more than a bound) sit the step out, so that they do not slow the others'
    step (gateway/serving/fairness.py). On a CPU a step costs about in proportion to its
    rows, so this is what keeps a tenant's latency beside another's long requests; on a GPU
    a step of many rows costs about what one costs, so holding rows back would only waste
    it. ``auto``: on, unless the models run on CUDA. ``true``/``false`` mean on/off."""
    torch_threads: int | None = None
    """CPU threads of the inference thread's torch kernels; default the physical cores less
    one (at least one), so that the event loop keeps a core: with a kernel thread on every
    core, the event loop's work preempts one and the rest wait for it at every parallel
    region. The inference thread is the only one that runs torch."""
    audit_fail_closed: bool = True
    """If the audit store cannot be written, refuse inference with 503 (default): a request
    whose admission record cannot be written is refused before any output."""
    shutdown_grace_s: int = 30
    """On shutdown (SIGTERM): seconds the requests in flight get to finish; new ones are
    refused meanwhile. Those still running then are ended at their next step and recorded
    (503, ``shutting_down``). GATEWAY_SHUTDOWN_GRACE_S."""
    database_lock_timeout_ms: int = 5_000
    """PostgreSQL ``lock_timeout`` of the gateway's connections: an audit write that waits
    longer for a lock (another replica stuck holding the chain's lock, a ``LOCK TABLE``)
    fails and its request gets 503 ``audit_unavailable`` instead of hanging. 0: no limit."""
    database_statement_timeout_ms: int = 15_000
    """PostgreSQL ``statement_timeout`` of the gateway's connections (lock waits included).
    0: no limit. The migrations (``upgrade``) run without it."""
    database_idle_in_transaction_timeout_ms: int = 60_000
    """PostgreSQL ``idle_in_transaction_session_timeout``: the server ends a gateway session
    idle this long inside a transaction, releasing the locks a stuck replica holds. 0: no
    limit."""
    retention_interval_s: int = 3600
    """Seconds between runs of the retention job, which deletes prompt/completion payloads
    past their tenant's ``payload_retention_days`` and records each deletion as an admin
    event (``audit.payloads_purged``); the first run is a few seconds after start. 0: never
    (run ``python -m gateway.database purge`` from a scheduler of your own instead)."""
    audit_checkpoint_interval_s: int = 60
    """Longest wait, in seconds, between a chain row being written and a signed checkpoint
    covering it: each replica's checkpoint job sequences the new rows of the audit chains
    into the Merkle log and signs a checkpoint (docs/audit.md, "The verifiable log"); one
    replica signs at a time, so replicas make one log. 0: no job (sign with ``python -m
    gateway.database checkpoint`` from a scheduler of your own)."""
    audit_checkpoint_records: int = 1000
    """Sign sooner, as soon as this many chain rows wait for a checkpoint (the job looks
    every 2 seconds)."""
    audit_signing_key: str | None = None
    """The log's Ed25519 signing key: its text (``PRIVATE+KEY+<origin>+...``, as a secrets
    manager or KMS-backed secret injects it) or the path of a file holding it (``python -m
    gateway.database keygen``). Its name is the log's origin. Unset: generated on first
    start in ``{var_dir}/audit-log.key``, its public key in ``audit-log.pub`` (give that to
    auditors). A new key is registered, and recorded as the admin event
    ``audit.signing_key_rotated``, with the first checkpoint it signs; every replica must
    hold the same key."""
    audit_log_origin: str = "gateway.local/audit"
    """The origin (log name) of a key generated on first start; a given key's own name
    wins."""
    audit_checkpoint_file: str | None = None
    """Append-only file every checkpoint this replica signs is appended to (signed notes,
    blank-line separated: the ``--checkpoints`` file of ``verify-export``). Put it where the
    database's operator cannot rewrite it (another host's mount, a WORM volume, a file with
    ``chattr +a``). Unset: ``{var_dir}/audit-checkpoints.txt``; ``off``: none."""
    audit_witness_url: str | None = None
    """A witness's ``add-checkpoint`` URL (``https://witness.example/witness/add-checkpoint``,
    another gateway with ``witness_key`` set, or an auditor's): each checkpoint is sent
    there, and its cosignature stored beside the checkpoint. Unset: no witness."""
    audit_witness_vkey: str | None = None
    """The witness's verifier key (``<name>+<id>+<key>``): its cosignatures are checked
    before they are stored. Unset: stored as they come (the verifier checks them anyway)."""
    audit_s3_bucket: str | None = None
    """An S3 bucket with Object Lock enabled: each checkpoint this replica signs is put there
    as one object under a retention lock (docs/audit.md, "Where the checkpoints go"), which
    nobody, in ``COMPLIANCE`` mode not even the account's root user, can delete or shorten
    before it ends. Needs boto3 (the ``s3`` extra: the start stops without it); credentials
    and region from boto3's standard chain (``AWS_*``, ``~/.aws``, the instance or pod
    role), never a gateway setting. A bucket without Object Lock is logged as an error and
    shown as ``unprotected`` in the checkpoints' status. Unset: none."""
    audit_s3_prefix: str = "checkpoints/"
    """Key prefix of the checkpoint objects: ``<prefix><tree size, zero-padded to 20
    digits>``, so a listing is in log order."""
    audit_s3_endpoint_url: str | None = None
    """An S3-compatible store's endpoint (MinIO, Ceph RGW: ``https://minio.internal:9000``).
    Unset: AWS."""
    audit_s3_retention_days: int = 365
    """Each checkpoint object's retention: locked until this many days after it is put. In
    ``COMPLIANCE`` mode that cannot be undone: try a bucket of your own in ``GOVERNANCE``
    first."""
    audit_s3_lock_mode: str = "COMPLIANCE"
    """``COMPLIANCE`` (nobody can delete an object or shorten its retention) or
    ``GOVERNANCE`` (a user granted ``s3:BypassGovernanceRetention`` can)."""
    witness_key: str | None = None
    """Run a witness in this gateway (``POST /witness/add-checkpoint``): its cosigning key,
    as text (``PRIVATE+KEY+<witness name>+...``) or a file path. It cosigns a checkpoint of
    a log in ``witness_logs`` only when it is consistent with the last one it cosigned,
    kept in ``{var_dir}/witness-state.json``. Unset: no witness endpoint."""
    witness_logs: str | None = None
    """The logs the witness accepts: their verifier keys, comma-separated, or a file of
    them, one a line."""
    max_body_bytes: int = 10_000_000
    """Largest request body, in bytes (Litestar's ``request_max_body_size``, whose default
    this keeps): a larger one is refused with 413 in OpenAI's error shape before it is
    read. The prompt's own limits (1 MiB of characters) are checked after decoding."""
    default_requests_per_minute: int = 600
    """Per-tenant request rate limit when the tenant's policy sets none."""
    default_tokens_per_minute: int = 200_000
    """Per-tenant token rate limit (prompt + max completion) when the policy sets none."""
    redis_url: str | None = None
    """Redis for the per-tenant rate limits shared by every replica (redis://host:6379/0).
    Unset: each process keeps its own window (N replicas let up to N x the limit through)."""
    redis_prefix: str = "gw:rl:"
    """Prefix of the rate limiter's Redis keys (one per gateway deployment)."""
    redis_fail_closed: bool = False
    """Redis down: refuse inference with 503 (true) or fall back to per-replica limits
    (false, the default: counted in gateway_ratelimit_backend_errors_total and logged)."""
    oidc_jwks: str | None = None
    """Accept operators' OIDC / JWT bearer tokens signed by these keys: a JWKS file path or
    an https:// URL (the identity provider's jwks_uri; http:// is refused at start except to
    a loopback host). Read again every 5 minutes and on a token with an unknown key id (at
    most once per 30 s); a key the provider removed is refused from the next read. Unset:
    API keys only."""
    oidc_issuer: str | None = None
    """Required ``iss`` of accepted tokens. Required with ``oidc_jwks`` (the start fails
    without it) unless ``oidc_allow_unchecked_claims``."""
    oidc_audience: str | None = None
    """Required ``aud`` of accepted tokens (the gateway's client id at the provider).
    Required with ``oidc_jwks`` unless ``oidc_allow_unchecked_claims``."""
    oidc_allow_unchecked_claims: bool = False
    """``true``: start without ``oidc_issuer`` / ``oidc_audience`` and leave the unset claim
    unchecked (any token the provider signs, for any application, is then accepted)."""
    oidc_role_claim: str = "roles"
    """Claim holding the operator role(s); a dotted path reaches nested claims
    (``realm_access.roles``)."""
    oidc_name_claim: str = "sub"
    """Claim naming the operator; audited as ``oidc:<value>``."""
    metrics_key: str | None = None
    """Bearer key that /metrics requires (Prometheus's ``authorization`` credentials); the
    admin key is accepted too. Unset: /metrics is open. Set it where the network is shared:
    the metrics name tenants."""
    console: bool = True
    """Serve the operator console at /console (static pages over the JSON API)."""
    log_level: str = "info"
    """Log level of the JSON logs (debug, info, warning, error)."""
    var_dir: str = str(ROOT / "var")
    """Folder for local state: the SQLite database unless ``database_url`` is set, the admin
    key hash, the compile cache (``compile-cache/``) and the linear verdicts."""

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None, **overrides: object) -> Settings:
        env = dict(os.environ if env is None else env)
        values: dict[str, object] = {}
        for f in fields(cls):
            raw = env.get(f"GATEWAY_{f.name.upper()}")
            if raw is None:
                continue
            values[f.name] = _parse(raw, f.type, f"GATEWAY_{f.name.upper()}")
        values.update(overrides)
        if "var_dir" in values and "database_url" not in values:  # its database goes along
            values["database_url"] = (
                f"sqlite+aiosqlite:///{Path(str(values['var_dir'])) / 'gateway.db'}"
            )
        return cls(**values)  # type: ignore[arg-type]


TRUE = frozenset({"1", "true", "yes", "on"})
FALSE = frozenset({"0", "false", "no", "off", ""})


def _parse(raw: str, type_name: object, name: str = "a boolean setting") -> object:
    kind = str(type_name)
    if kind.startswith("bool"):
        value = raw.strip().lower()
        if value not in TRUE | FALSE:  # a typo must not silently turn a feature off
            raise ValueError(f"{name} must be true or false (1/0, yes/no, on/off), got {raw!r}")
        return value in TRUE
    if kind.startswith("int"):
        return int(raw)
    return raw
