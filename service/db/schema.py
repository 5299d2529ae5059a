"""Table definitions: the one metadata that Alembic migrations are checked against."""

from sqlalchemy import (
    CHAR,
    BigInteger,
    Column,
    DateTime,
    Float,
    ForeignKey,
    Identity,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, UUID

metadata = MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "ck": "ck_%(table_name)s_%(constraint_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
        "pk": "pk_%(table_name)s",
    }
)

NOW = text("now()")

tenants = Table(
    "tenants",
    metadata,
    Column("name", String(128), primary_key=True),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=NOW),
)

tokens = Table(
    "tokens",
    metadata,
    Column("id", BigInteger, Identity(), primary_key=True),
    Column("name", String(128), nullable=False),
    Column("kind", String(16), nullable=False),
    Column(
        "hash", LargeBinary, nullable=False, unique=True
    ),  # sha256 of the token; never the token
    Column("tenants", ARRAY(String(128)), nullable=False, server_default="{}"),
    Column("created_by", String(200), nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=NOW),
    Column("expires_at", DateTime(timezone=True), nullable=False),
    Column("revoked_at", DateTime(timezone=True)),
    # Two-phase rotation of a worker's credential: the next hash is valid from the moment the
    # server sends it; once the worker confirms it stored it, it replaces `hash`.
    Column("next_hash", LargeBinary, unique=True),
    Column("rotated_at", DateTime(timezone=True)),
    # A worker credential made by a join token is bound: its pool and labels are the server's
    # choice, not what the worker says in its hello. NULL: the worker names them.
    Column("pool", String(128)),
    Column("labels", ARRAY(String(256))),
    # One unrevoked token per name: a worker's name is its token's name.
    Index("tokens_one_live_name", "name", unique=True, postgresql_where=text("revoked_at IS NULL")),
)

pools = Table(
    "pools",
    metadata,
    Column("name", String(128), primary_key=True),
    Column("slots", JSONB, nullable=False),
    Column("max_load", Float, nullable=False, server_default="0"),
    Column("min_memory_gb", Float, nullable=False, server_default="0"),
    Column("min_disk_gb", Float, nullable=False, server_default="0"),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=NOW),
)

workers = Table(
    "workers",
    metadata,
    Column("id", UUID(as_uuid=False), primary_key=True),
    Column("name", String(128), nullable=False, unique=True),
    Column("pool", String(128), nullable=False),
    Column("state", String(16), nullable=False, server_default="active"),  # operator's word
    Column("liveness", String(16), nullable=False, server_default="ok"),  # ok|unreachable|lost|gone
    Column("instance", String(64), nullable=False),  # the worker process; new on restart
    # Who attached it: `token:<id>` (a token or a joined credential, the same across its
    # rotations) or `proxy:<digest>` (the worker rule that matched). A row belongs to one
    # identity: another attaches under its name only when it is not live and holds no lease.
    Column("identity", String(200), nullable=False, server_default=""),
    Column("server_id", String(64)),  # the server holding its websocket, while attached
    Column("labels", ARRAY(String(256)), nullable=False, server_default="{}"),
    # A worker token with tenants serves only their jobs (a tenant's own machines); {}: any.
    Column("tenants", ARRAY(String(128)), nullable=False, server_default="{}"),
    Column("parallel", Integer, nullable=False, server_default="0"),
    Column("host", JSONB, nullable=False, server_default="{}"),
    # What it declared at hello: {"cpus": float, "memory_mb": int, "gpus": int}; {}: nothing.
    Column("capacity", JSONB, nullable=False, server_default="{}"),
    Column("python", String(64), nullable=False, server_default=""),
    Column("env_digest", String(128), nullable=False, server_default=""),
    Column("version", String(32), nullable=False, server_default=""),
    Column("attached_at", DateTime(timezone=True), nullable=False, server_default=NOW),
    Column("last_seen_at", DateTime(timezone=True), nullable=False, server_default=NOW),
    Index(
        "ix_workers_silence",
        "last_seen_at",
        postgresql_where=text("liveness IN ('ok', 'unreachable')"),
    ),
)

jobs = Table(
    "jobs",
    metadata,
    Column("id", BigInteger, Identity(), primary_key=True),
    Column("tenant", String(128), ForeignKey("tenants.name"), nullable=False),
    Column("state", String(16), nullable=False, server_default="queued"),
    Column("kind", String(64), nullable=False, server_default="default"),
    Column("pool", String(128)),  # None: any pool with slots of its kind
    Column("labels", ARRAY(String(256)), nullable=False, server_default="{}"),
    Column("device_policy", String(16), nullable=False, server_default="require"),
    Column("command", ARRAY(Text), nullable=False, server_default="{}"),
    Column("python", Text, nullable=False, server_default=""),
    # The Python source's hash in the artifact store (it travels with the job by hash).
    Column("python_sha256", String(64), nullable=False, server_default=""),
    Column("env", JSONB, nullable=False, server_default="{}"),
    # [{name, sha256, kind}]: fetched into the job's folder before it starts.
    Column("inputs", JSONB, nullable=False, server_default="[]"),
    Column("repo", Text, nullable=False, server_default=""),  # URL[@REV] cloned for it
    # [{path, sha256, size}]: what it left under $BERTH_OUTPUT, kept for `job fetch`.
    Column("outputs", JSONB, nullable=False, server_default="[]"),
    Column("metrics", JSONB, nullable=False, server_default="{}"),  # emit(): newest per name
    Column("secrets", JSONB, nullable=False, server_default="{}"),  # variable -> secret name
    Column("timeout_seconds", Float, nullable=False, server_default="0"),
    Column("max_attempts", Integer, nullable=False, server_default="3"),
    Column("attempt", Integer, nullable=False, server_default="0"),  # = epoch of the last lease
    Column("priority", Integer, nullable=False, server_default="0"),
    # What it asked for (SPEC section 4, "Resources"); 0 reserves nothing.
    Column("cpus", Float, nullable=False, server_default="0"),
    Column("memory_mb", BigInteger, nullable=False, server_default="0"),
    Column("gpus", Integer, nullable=False, server_default="0"),
    Column("worker", String(128)),
    Column("exit_code", Integer),
    Column("error", Text, nullable=False, server_default=""),
    Column("created_by", String(200), nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=NOW),
    Column("started_at", DateTime(timezone=True)),
    Column("finished_at", DateTime(timezone=True)),
    # The dispatcher's scan: queued jobs by tenant, priority, age.
    Index(
        "ix_jobs_queued",
        "tenant",
        text("priority DESC"),
        "id",
        postgresql_where=text("state = 'queued'"),
    ),
    # Running jobs per tenant, for fairness.
    Index("ix_jobs_live_tenant", "tenant", postgresql_where=text("state IN ('leased', 'running')")),
    Index("ix_jobs_tenant_id", "tenant", "id"),
)

leases = Table(
    "leases",
    metadata,
    Column("id", BigInteger, Identity(), primary_key=True),
    Column("job_id", BigInteger, ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False),
    Column("epoch", Integer, nullable=False),
    # A worker row goes (forgotten, or taken over) only when it holds no live lease; its
    # ended leases' history goes with it.
    Column(
        "worker_id",
        UUID(as_uuid=False),
        ForeignKey("workers.id", ondelete="CASCADE"),
        nullable=False,
    ),
    Column("kind", String(64), nullable=False),
    # The job's request, copied at grant: a worker's reserved resources sum its live leases.
    Column("cpus", Float, nullable=False, server_default="0"),
    Column("memory_mb", BigInteger, nullable=False, server_default="0"),
    Column("gpus", Integer, nullable=False, server_default="0"),
    Column("state", String(16), nullable=False, server_default="live"),
    Column("granted_at", DateTime(timezone=True), nullable=False, server_default=NOW),
    Column("ended_at", DateTime(timezone=True)),
    UniqueConstraint("job_id", "epoch"),
    # The invariant the whole lease design rests on: at most one live lease per job.
    Index(
        "leases_one_live_per_job", "job_id", unique=True, postgresql_where=text("state = 'live'")
    ),
    Index("ix_leases_live_worker", "worker_id", postgresql_where=text("state = 'live'")),
)

job_output = Table(
    "job_output",
    metadata,
    Column("id", BigInteger, Identity(), primary_key=True),
    Column("job_id", BigInteger, ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False),
    Column("epoch", Integer, nullable=False),
    # The worker's report sequence number: a report resent after a reconnect is kept once.
    Column("seq", BigInteger, nullable=False),
    Column("stream", String(8), nullable=False),
    Column("data", LargeBinary, nullable=False),  # bytes as the job wrote them
    Column("at", DateTime(timezone=True), nullable=False, server_default=NOW),
    Index("ix_job_output_job_id_id", "job_id", "id"),
    UniqueConstraint("job_id", "epoch", "seq"),
)

audit = Table(
    "audit",
    metadata,
    Column("id", BigInteger, Identity(), primary_key=True),
    Column("at", DateTime(timezone=True), nullable=False, server_default=text("clock_timestamp()")),
    Column("caller", String(200), nullable=False),
    Column("action", String(64), nullable=False),
    Column("target", String(256), nullable=False),
    Column("tenant", String(128)),
    Column("request_id", String(64), nullable=False, server_default=""),
    Column("detail", JSONB, nullable=False, server_default="{}"),
    # Sealing (hash chaining) happens in batches after insert, so writers never serialise on
    # the chain's head: seq orders the chain, hash covers the previous entry's hash.
    Column("seq", BigInteger, unique=True),
    Column("hash", LargeBinary),
    # A nonce and the server's HMAC over the entry's content, made on insert (core/audit_chain
    # row_mac): the sealer chains only entries a server holding the key wrote.
    Column("mac", LargeBinary, unique=True),
    Index("ix_audit_unsealed", "id", postgresql_where=text("seq IS NULL")),
)

# The audit chain is keyed (HMAC with a key derived from the secret key, never stored here) from
# the entry `keyed_from` on; `mac` signs that number with the same key, so moving the boundary
# (to pass keyed entries off as plain SHA-256 ones) is detected. One row at most.
audit_anchor = Table(
    "audit_anchor",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("keyed_from", BigInteger, nullable=False),
    Column("mac", LargeBinary, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=NOW),
)

secrets = Table(
    "secrets",
    metadata,
    Column("id", BigInteger, Identity(), primary_key=True),
    Column("name", String(128), nullable=False),
    Column("tenant", String(128), nullable=False, server_default=""),  # "": global
    Column("nonce", LargeBinary, nullable=False),
    Column("ciphertext", LargeBinary, nullable=False),
    Column("created_by", String(200), nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=NOW),
    UniqueConstraint("tenant", "name"),
)

# Operator overrides of config keys (`berth limits`), in force on every server from its next
# pass; berth.toml stays the default.
limits = Table(
    "limits",
    metadata,
    Column("key", String(200), primary_key=True),  # e.g. pools.gpu.provisioner.max
    Column("value", JSONB, nullable=False),
    Column("reason", Text, nullable=False),
    Column("set_by", String(200), nullable=False),
    Column("set_at", DateTime(timezone=True), nullable=False, server_default=NOW),
)

# This installation's id, made by the first migration and kept: provisioned workers are
# labelled with it, so a new leader finds what an old one started (and nobody else's).
installation = Table(
    "installation",
    metadata,
    Column("id", UUID(as_uuid=False), primary_key=True, server_default=text("gen_random_uuid()")),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=NOW),
)

# One-time join tokens: a node trades one for a credential of its own at its first attach.
# The token binds the pool, labels, tenants and name; the server decides them, not the worker.
join_tokens = Table(
    "join_tokens",
    metadata,
    Column("id", BigInteger, Identity(), primary_key=True),
    Column("hash", LargeBinary, nullable=False, unique=True),
    Column("name", String(128), nullable=False),
    Column("pool", String(128), nullable=False),
    Column("labels", ARRAY(String(256)), nullable=False, server_default="{}"),
    Column("tenants", ARRAY(String(128)), nullable=False, server_default="{}"),
    Column("created_by", String(200), nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=NOW),
    Column("expires_at", DateTime(timezone=True), nullable=False),
    Column("spent_at", DateTime(timezone=True)),
)

# Workers the provisioning loop started (or is starting): its intent, written before it calls
# the provider, and what the provider last said.
provisioned = Table(
    "provisioned",
    metadata,
    Column("name", String(128), primary_key=True),
    Column("pool", String(128), nullable=False),
    Column("provider", String(32), nullable=False),
    Column("state", String(16), nullable=False, server_default="starting"),
    Column("provider_id", String(256), nullable=False, server_default=""),
    Column("detail", Text, nullable=False, server_default=""),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=NOW),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=NOW),
    # Last time the loop saw it hold a lease (or start): idle_seconds counts from here.
    Column("busy_at", DateTime(timezone=True), nullable=False, server_default=NOW),
    Index(
        "ix_provisioned_active", "pool", postgresql_where=text("state NOT IN ('stopped', 'failed')")
    ),
)

# Per provisioned pool: start failures in a row and when the next start may be tried.
pool_health = Table(
    "pool_health",
    metadata,
    Column("pool", String(128), primary_key=True),
    Column("failures", Integer, nullable=False, server_default="0"),
    Column("next_try_at", DateTime(timezone=True)),
    Column("last_error", Text, nullable=False, server_default=""),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=NOW),
)

# Artifact references: a tenant may read a blob only through one it holds (SPEC 3). A reference
# of a job holds its blob while the job runs and for [cas] gc_days after jobs.finished_at; one
# without a job (an upload) from `ended_at` on. `size` is -1 while the write that made it is in
# progress: such a reference keeps the blob from the collector but grants no read.
cas_refs = Table(
    "cas_refs",
    metadata,
    Column("id", BigInteger, Identity(), primary_key=True),
    Column("tenant", String(128), nullable=False),  # "": the collector's note of a stray blob
    Column("sha256", CHAR(64), nullable=False),
    Column("size", BigInteger, nullable=False),
    Column("what", String(16), nullable=False),  # upload|input|output|log|code|repo|unclaimed
    Column("job_id", BigInteger, ForeignKey("jobs.id", ondelete="SET NULL")),
    Column("created_by", String(200)),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=NOW),
    Column("ended_at", DateTime(timezone=True)),
    Index("ix_cas_refs_tenant_sha256", "tenant", "sha256"),
    Index("ix_cas_refs_sha256", "sha256"),
    Index("ix_cas_refs_job_id", "job_id"),  # ON DELETE SET NULL of a job finds its rows
)

# Old output moved from job_output (rows) to the artifact store, in order: Postgres keeps only
# the newest `output_tail_kb` of a job's output; `job logs` reads the rest from here.
job_log_segments = Table(
    "job_log_segments",
    metadata,
    Column("id", BigInteger, Identity(), primary_key=True),
    Column("job_id", BigInteger, ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False),
    Column("first_id", BigInteger, nullable=False),  # the job_output ids it holds, inclusive
    Column("last_id", BigInteger, nullable=False),
    Column("sha256", String(64), nullable=False),
    Column("size", BigInteger, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=NOW),
    Index("ix_job_log_segments_job_id_last_id", "job_id", "last_id"),
)

# A job's request for a person's yes (`request_approval`), asked through its worker's relay while
# its lease (job_id, epoch) is live. The policy and deadline are fixed when it is asked (from
# [pools.P] of the worker holding the lease); the server times it out as denied at `deadline`
# (the leader's pass, and every read or answer, in the same transaction).
approvals = Table(
    "approvals",
    metadata,
    Column("id", BigInteger, Identity(), primary_key=True),
    Column("job_id", BigInteger, ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False),
    Column("epoch", Integer, nullable=False),
    Column("tenant", String(128), nullable=False),
    Column("pool", String(128), nullable=False),
    Column("title", String(200), nullable=False),
    Column("details", Text, nullable=False, server_default=""),
    # pending | approved | denied | timed_out | closed (the lease ended first)
    Column("state", String(16), nullable=False, server_default="pending"),
    Column("policy", String(16), nullable=False),  # four-eyes | any-member
    Column("job_creator", String(200), nullable=False),  # four-eyes: who may not answer
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=NOW),
    Column("deadline", DateTime(timezone=True), nullable=False),
    Column("answered_by", String(200)),
    Column("answered_at", DateTime(timezone=True)),
    Column("reason", Text, nullable=False, server_default=""),
    Index("ix_approvals_pending", "deadline", postgresql_where=text("state = 'pending'")),
    Index("ix_approvals_tenant_id", "tenant", "id"),
    Index("ix_approvals_job_id", "job_id"),
)
