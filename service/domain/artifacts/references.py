"""References other domain code makes for jobs: what keeps a blob, and who may read it.

`reference_held`: what a tenant names (inputs), NotFound unless it holds them; `reference`:
what the server just wrote for a tenant (code, output segments); `reference_reported`: what a
worker reports for its live job, taken at its word only from a fleet-wide worker.
"""

from collections.abc import Sequence
from dataclasses import dataclass

import structlog

from service.core.errors import Invalid, NotFound
from service.db.driver import Conn
from service.db.queries import artifacts as artifacts_q
from service.db.queries.artifacts import Ref
from service.domain.artifacts.blobs import check_sha
from service.domain.artifacts.server_store import DAY

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class Named:
    """A blob a tenant names for its job (an input): referenced only if the tenant holds it."""

    tenant: str
    sha256: str
    what: str
    job_id: int


@dataclass(frozen=True, slots=True)
class Reported:
    """A blob a worker reports for its live job (an output, a saved artifact)."""

    worker_tenants: tuple[str, ...]  # () for a fleet-wide worker
    tenant: str
    sha256: str
    size: int
    what: str
    job_id: int


async def reference_held(conn: Conn, named: Sequence[Named], *, by: str, gc_days: float) -> None:
    """Reference for their jobs blobs their tenants already hold (inputs).

    NotFound when a tenant holds no complete reference to one, the same answer as for a blob
    that does not exist. In the caller's transaction, under the blobs' shared locks; a few
    statements for any number of blobs.
    """
    if not named:
        return
    await artifacts_q.lock_shared(conn, *(check_sha(n.sha256) for n in named))
    sizes: dict[str, dict[str, int]] = {}
    for tenant in {n.tenant for n in named}:
        shas = [n.sha256 for n in named if n.tenant == tenant]
        sizes[tenant] = await artifacts_q.held_sizes(
            conn, tenant=tenant, shas=shas, gc=gc_days * DAY
        )
    if missing := next((n for n in named if n.sha256 not in sizes[n.tenant]), None):
        raise NotFound(f"no blob {missing.sha256}")
    await artifacts_q.insert_many(
        conn,
        [Ref(n.tenant, n.sha256, sizes[n.tenant][n.sha256], n.what, n.job_id, by) for n in named],
    )


async def reference(conn: Conn, refs: Sequence[Ref]) -> None:
    """Reference blobs written to the store for their tenants (code, a job's output segments).

    The caller vouches that each blob is in the store and came from that tenant: use it for
    what the server wrote itself; for anything a tenant names, `reference_held`; for what a
    worker reports, `reference_reported`.
    """
    for r in refs:
        check_sha(r.sha256)
        if r.size < 0:
            raise Invalid("a blob's size is >= 0")
    await artifacts_q.insert_many(conn, refs)


async def reference_reported(conn: Conn, reported: Sequence[Reported]) -> set[tuple[int, str]]:
    """Reference blobs workers report for their live jobs; the (job, sha256) accepted.

    A write through this server for the job already referenced it. Otherwise only a fleet-wide
    worker is taken at its word (it reaches the store directly, and a blob written before its
    reference is kept by the collector for [cas] gc_days after it first sees it); a
    tenant-bound one could name another tenant's hash, so its report is refused unless the
    fenced write made it.
    """
    for r in reported:
        check_sha(r.sha256)
    written = await artifacts_q.written_for_jobs(conn, [(r.job_id, r.sha256) for r in reported])
    new = {
        (r.job_id, r.sha256): r
        for r in reported
        if (r.job_id, r.sha256) not in written and not r.worker_tenants
    }
    for r in reported:
        if r.worker_tenants and (r.job_id, r.sha256) not in written:
            log.warning("reported_blob_refused", job=r.job_id, sha256=r.sha256, what=r.what)
    await reference(
        conn,
        [
            Ref(r.tenant, r.sha256, r.size, r.what, r.job_id, f"job:{r.job_id}")
            for r in new.values()
        ],
    )
    return written | set(new)


async def drop_unlisted_outputs(conn: Conn, listed: Sequence[tuple[int, Sequence[str]]]) -> None:
    """Let go of each job's output references to blobs its result does not list (job, shas).

    What a result does not list was not kept, and grants nothing.
    """
    await artifacts_q.drop_outputs_except(conn, listed)
