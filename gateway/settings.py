"""Typed settings, read from the environment (GATEWAY_*), with documented defaults.

Every field below is one environment variable: the field name upper-cased with the
GATEWAY_ prefix (``port`` -> ``GATEWAY_PORT``). Its docstring is its documentation: the
settings table of docs/configuration.md is generated from them (``python -m
gateway.settings_doc``), so write them for that page (Markdown, links relative to docs/).
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
    """Any SQLAlchemy async URL; PostgreSQL: ``postgresql+asyncpg://user@host/db``. Default:
    SQLite, ``gateway.db`` in ``GATEWAY_VAR_DIR`` (setting the folder moves the database with
    it). The start line shows the URL (and ``GATEWAY_REDIS_URL``) with the password masked
    (``user:***@host``)."""
    migrate_on_start: bool = True
    """Run Alembic ``upgrade head`` at start; ``false`` where a migrate job runs it instead (see
    [production](operations.md#production-docker-compose))."""
    admin_key: str | None = None
    """Bootstrap admin bearer key, at least 16 characters; a sample placeholder (``CHANGE_ME``
    of ``deploy/``, ``sk-admin-...`` of the README) stops the start with a message (exit status
    2). Unset: one is generated on first start, printed once, and its hash kept in
    ``GATEWAY_VAR_DIR`` (``admin_key.sha256``)."""
    models: str = field(default_factory=_default_models)
    """Model manifest (YAML; see [run your own models](models.md)). Default: the bundled demo
    pair."""
    policies: str = str(ROOT / "policies" / "bundles")
    """Folder of policy bundles (``default.yaml`` and ``tenants/*.yaml``; the format is in
    ``policies/README.md``)."""
    device: str | None = None
    """torch device of the models (``cuda``, ``cpu``). Unset: CUDA when present, else the
    CPU."""
    dtype: str | None = None
    """Model dtype (``float32``, ``bfloat16``, ``float16``; see [dtype and
    exactness](batching-and-speed.md#dtype-and-exactness)). Unset: ``float32`` on the CPU,
    ``bfloat16`` on CUDA."""
    queue_capacity: int = 32
    """Requests that may wait for the inference worker; the next one is refused with 503
    (``overloaded``)."""
    max_active: int = 16
    """Requests the worker runs at once (batch rows of every target, plus admin jobs such as a
    promotion's regression gate); the others wait in the queue."""
    max_batch: int = 8
    """Rows of one target's continuous batch: requests that share every target forward. Each row
    reserves a KV slot of the target's full context length (see [continuous
    batching](batching-and-speed.md#continuous-batching))."""
    prefill_chunk: int = 128
    """Prompt tokens one batch step prefills at most for one row: a long prompt enters the batch
    over several steps, so the rows already decoding wait one chunk per step, not a whole
    prompt. A row prefilling alone takes a rest of up to a quarter chunk with its last chunk (a
    forward of its own would cost more). Smaller: steadier inter-token latency for the others, a
    longer time to first token for the arrival. At least 1."""
    prefill_budget: int = 512
    """Prompt tokens one batch step prefills at most for all rows together (rows x longest
    chunk, padding included; at least ``GATEWAY_PREFILL_CHUNK``): arrivals that come together
    prefill in one forward, whose matrix products cost less per token than one row's. At least
    1."""
    kv_budget_tokens: int | None = None
    """KV cache budget of one target's batch, in tokens: its rows are capped at budget //
    context length (each row's slot holds a full context), at least 1. Arrivals past the rows
    wait in the queue. Unset: no cap beyond ``GATEWAY_MAX_BATCH`` (see [continuous
    batching](batching-and-speed.md#continuous-batching))."""
    measure_costs: bool = True
    """Time each model's forwards for batches of 1..``GATEWAY_MAX_BATCH`` rows when it loads
    (seconds for the demo models, longer for larger ones on a CPU), so that auto mode's cost
    model starts from measurements; the batch then keeps following its real forwards either
    way."""
    cpu_linear: str = "auto"
    """fp32 linear layers on the CPU: ``auto`` times torch's forward and the weight-major one at
    load, on the model's own weights and its steps' row counts, and keeps the faster; the
    verdict is kept per model shape and machine in ``GATEWAY_VAR_DIR``
    (``linear-verdicts.json``) and later starts read it instead of measuring (where the two are
    close a fresh timing could choose differently; delete the file to measure again). ``on``
    always uses the weight-major forward, ``off`` keeps torch's."""
    compile: str = "off"
    """``off``, ``on`` or ``auto``: compile the batch path's decode steps with torch.compile at
    start (the Llama, Mistral and Qwen2 families; others stay eager, with a log line; see
    [compiled step](batching-and-speed.md#compiled-step)). Every manifest model then loads and
    compiles before the gateway says it is ready: a cold start takes minutes on a small CPU, a
    restart loads the saved steps (``compile-cache/`` in ``GATEWAY_VAR_DIR`` unless
    ``TORCHINDUCTOR_CACHE_DIR`` is set). ``auto`` then times each kind of step (one row or
    several, one token or several) compiled and eager on this device and serves compiled only
    the kinds at least 3% faster. A draft registered while the gateway runs stays eager. Off by
    default because of the first start's time. ``true``/``false`` mean on/off; any other value
    stops the start with an error."""
    cuda_graphs: str = "off"
    """On a CUDA device: ``off``, ``on`` or ``auto``: replay the batch path's decode steps as
    captured CUDA graphs, padded to buckets of rows x tokens x key span, each bucket recorded on
    its first step (the families ``GATEWAY_COMPILE`` compiles). ``auto`` times each kind of step
    captured and eager at start and keeps the kinds at least 3% faster. With ``GATEWAY_COMPILE``
    on or auto the compiled step is what gets captured. A capture that fails turns the model's
    graphs off, with a log line. Ignored on the CPU. Experimental, and off by default: not yet
    run on a GPU. ``true``/``false`` mean on/off."""
    prefix_cache: bool = True
    """Keep the keys and values of finished requests' prompts (and outputs) in the batch's free
    slots, and let the same tenant's next request with the same beginning skip prefilling it: a
    chat's next turn, or a shared system prompt (see [kept prompt
    prefixes](batching-and-speed.md#kept-prompt-prefixes)). Per tenant: another tenant never
    reuses them (its time to first token would tell what was sent). Reported as
    ``usage.prompt_tokens_details.cached_tokens`` and ``gateway_prompt_cached_tokens_total``. No
    memory beyond the batch's slots, which exist anyway. ``false``: every prompt is
    prefilled."""
    fair_steps: str = "auto"
    """``on``, ``off`` or ``auto``: when tenants share a batch, each decoding step only the
    rows of the tenant with the least time of the batch so far (over its weight) step, and the
    others sit the step out, so that one tenant's many long rows do not slow another's steps
    (see [fair sharing](batching-and-speed.md#fair-sharing)). On a CPU a step costs about in
    proportion to its rows, so this is what keeps a tenant's latency beside another's long
    requests; on a GPU a step of many rows costs about what one costs, so holding rows back
    would only waste it. ``auto``: on, unless the models run on CUDA. ``true``/``false`` mean
    on/off."""
    preempt: bool = True
    """When a tenant's job waits for a full batch while it holds fewer rows than its weighted
    share and another tenant holds more than its own, that tenant's newest row is parked (its
    keys and values copied out of the batch, at most one batch's worth) and resumes, exactly
    where it stopped, in its tenant's turn (see [fair sharing](batching-and-speed.md#fair-sharing)).
    So a tenant alone uses the whole batch and an arrival never waits for a long request to
    end. ``false`` (and on a backend whose memory cannot save a slot): a row keeps
    its slot until its request ends, and a tenant's default row cap is three quarters of the
    batch, so that another tenant's arrival finds a row."""
    torch_threads: int | None = None
    """CPU threads of the inference thread's torch kernels. Unset: the physical cores less one
    (at least one), so that the event loop keeps a core (see [where torch
    runs](#where-torch-runs))."""
    audit_fail_closed: bool = True
    """If the audit store cannot be written, refuse inference with 503 (default): a request
    whose admission record cannot be written is refused before any output."""
    shutdown_grace_s: int = 30
    """On shutdown (SIGTERM): seconds the requests in flight get to finish; new ones are refused
    meanwhile. Those still running then are ended at their next step and recorded (503,
    ``shutting_down``)."""
    database_lock_timeout_ms: int = 5_000
    """PostgreSQL ``lock_timeout`` of the gateway's connections: an audit write that waits
    longer for a lock (another replica stuck holding the chain's lock, a ``LOCK TABLE``) fails
    and its request gets 503 ``audit_unavailable`` instead of hanging (see [scale
    out](operations.md#scale-out)). 0: no limit."""
    database_statement_timeout_ms: int = 15_000
    """PostgreSQL ``statement_timeout`` of the gateway's connections (lock waits included). An
    audit query (``/audit/*``) past it, or past the lock limit, answers 503
    ``audit_unavailable``: narrow it with ``since``/``until``, or use the auditors' command line
    (no statement limit). The migrations run without it. 0: no limit."""
    database_idle_in_transaction_timeout_ms: int = 60_000
    """PostgreSQL ``idle_in_transaction_session_timeout``: the server ends a gateway session
    idle this long inside a transaction, releasing the locks a stuck replica holds. 0: no
    limit."""
    retention_interval_s: int = 3600
    """Seconds between runs of the retention job, which deletes prompt/completion payloads past
    their tenant's ``retention.payload_days`` and records each deletion as an admin event
    (``audit.payloads_purged``); the first run is a few seconds after start. 0: never (run
    ``python -m gateway.database purge`` from a scheduler of your own; see [auditors' command
    line](audit.md#auditors-command-line))."""
    audit_checkpoint_interval_s: int = 60
    """Longest wait, in seconds, between a chain row being written and a signed checkpoint
    covering it: each replica's checkpoint job sequences the new rows of the audit chains into
    the Merkle log and signs a checkpoint (see [the verifiable
    log](audit.md#the-verifiable-log-signed-checkpoints-an-outside-auditor-checks)); one replica
    signs at a time, so replicas make one log. 0: no job (sign with ``python -m gateway.database
    checkpoint`` from a scheduler of your own)."""
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
    another gateway with ``GATEWAY_WITNESS_KEY`` set, or an auditor's): each checkpoint is sent
    there, and its cosignature stored beside the checkpoint. The witness cosigns only a
    checkpoint consistent with the last one it cosigned. Unset: no witness."""
    audit_witness_vkey: str | None = None
    """The witness's verifier key (``<name>+<id>+<key>``): its cosignatures are checked
    before they are stored. Unset: stored as they come (the verifier checks them anyway)."""
    audit_s3_bucket: str | None = None
    """An S3 bucket with Object Lock enabled: each checkpoint this replica signs is put there as
    one object under a retention lock (see [where the checkpoints
    go](audit.md#where-the-checkpoints-go-and-what-each-choice-protects-against)), which nobody,
    in ``COMPLIANCE`` mode not even the account's root user, can delete or shorten before it
    ends. Needs boto3 (the ``s3`` extra: the start stops without it); credentials and region
    from boto3's standard chain (``AWS_*``, ``~/.aws``, the instance or pod role), never a
    gateway setting. A bucket without Object Lock is logged as an error and shown as
    ``unprotected`` in the checkpoints' status. Unset: none."""
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
    """Run a witness in this gateway (``POST /witness/add-checkpoint``): its cosigning key, as
    text (``PRIVATE+KEY+<witness name>+...``) or a file path. It cosigns a checkpoint of a log
    in ``GATEWAY_WITNESS_LOGS`` only when it is consistent with the last one it cosigned, kept
    in ``GATEWAY_VAR_DIR`` (``witness-state.json``). Unset: no witness endpoint."""
    witness_logs: str | None = None
    """The logs the witness accepts: their verifier keys, comma-separated, or a file of
    them, one a line."""
    max_body_bytes: int = 10_000_000
    """Largest request body, in bytes (Litestar's ``request_max_body_size``, whose default this
    keeps): a larger one is refused with 413 (``request_too_large``, OpenAI's error shape)
    before it is read. JSON nested too deep to decode is a 400. The prompt's own limits (1 MiB
    of characters) are checked after decoding."""
    default_requests_per_minute: int = 600
    """Per-tenant request rate limit when the tenant's policy sets none."""
    default_tokens_per_minute: int = 200_000
    """Per-tenant token rate limit (prompt + max completion) when the policy sets none."""
    redis_url: str | None = None
    """Redis for the per-tenant rate limits shared by every replica (``redis://host:6379/0``;
    see [scale out](operations.md#scale-out)). Unset: each process keeps its own window (N
    replicas let up to N x the limit through)."""
    redis_prefix: str = "gw:rl:"
    """Prefix of the rate limiter's Redis keys (one per gateway deployment)."""
    redis_fail_closed: bool = False
    """Redis down: refuse inference with 503 (``true``) or fall back to per-replica limits
    (``false``, the default: counted in ``gateway_ratelimit_backend_errors_total`` and
    logged)."""
    oidc_jwks: str | None = None
    """Accept operators' OIDC / JWT bearer tokens signed by these keys (see [named
    operators](operations.md#named-operators)): a JWKS file path or an ``https://`` URL (the
    identity provider's ``jwks_uri``; ``http://`` is refused at start except to a loopback
    host). Read again every 5 minutes and on a token with an unknown key id (at most once per 30
    s); a key the provider removed is refused from the next read. Unset: API keys only."""
    oidc_issuer: str | None = None
    """Required ``iss`` of accepted tokens. Required with ``GATEWAY_OIDC_JWKS`` (the start fails
    without it) unless ``GATEWAY_OIDC_ALLOW_UNCHECKED_CLAIMS``."""
    oidc_audience: str | None = None
    """Required ``aud`` of accepted tokens (the gateway's client id at the provider). Required
    with ``GATEWAY_OIDC_JWKS`` unless ``GATEWAY_OIDC_ALLOW_UNCHECKED_CLAIMS``."""
    oidc_allow_unchecked_claims: bool = False
    """``true``: start without ``GATEWAY_OIDC_ISSUER`` / ``GATEWAY_OIDC_AUDIENCE`` and leave the
    unset claim unchecked (any token the provider signs, for any application, is then
    accepted)."""
    oidc_role_claim: str = "roles"
    """Claim holding the operator role(s); a dotted path reaches nested claims
    (``realm_access.roles``)."""
    oidc_name_claim: str = "sub"
    """Claim naming the operator; audited as ``oidc:<value>``."""
    metrics_key: str | None = None
    """Bearer key that ``/metrics`` requires (Prometheus's ``authorization`` credentials); the
    admin key is accepted too. Unset: ``/metrics`` is open. Set it where the network is shared:
    the metrics name tenants."""
    console: bool = True
    """Serve the operator console at ``/console`` (static pages over the JSON API; see [operator
    console](operations.md#operator-console))."""
    log_level: str = "info"
    """Log level of the JSON logs (``debug``, ``info``, ``warning``, ``error``)."""
    var_dir: str = str(ROOT / "var")
    """Folder for local state: the SQLite database unless ``GATEWAY_DATABASE_URL`` is set, the
    admin key's hash, the audit log's generated key and checkpoint file, the compile cache
    (``compile-cache/``) and the linear verdicts."""

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
