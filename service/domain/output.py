"""A job's output: Postgres keeps the newest `output_tail_kb`, the store keeps the rest.

Workers stream output live into job_output rows. The leader's packer moves each job's oldest
rows beyond its tail into the artifact store, a segment at a time (one msgpack blob of the rows,
ids kept), referenced for the job's tenant; the rows go in the same transaction. Reading merges
segments and rows by id, so `job logs` returns everything, byte for byte, in order.
"""

import contextlib
from typing import Any

import msgspec
import structlog

from service.cas.base import CasError, Store, one_chunk
from service.db.engine import Database
from service.db.queries import jobs as jobs_q
from service.db.queries import output as output_q
from service.db.queries.artifacts import Ref
from service.db.records import OutputChunk
from service.domain.artifacts import references

log = structlog.get_logger(__name__)

SEGMENT_BYTES = 8 << 20  # the most output one segment holds
Record = tuple[int, int, int, str, bytes]  # id, epoch, seq, stream, data
_decode = msgspec.msgpack.Decoder(list[Record]).decode


class PackedByAnother(Exception):
    """Another leader packed these rows first: this pass's segment is dropped."""


async def pack(db: Database, store: Store, *, tail: int, limit: int = 100) -> int:
    """Move output beyond each job's tail into the store; returns the segments made."""
    async with db.begin() as conn:
        jobs = await output_q.over_tail(conn, tail=tail, limit=limit)
    made = 0
    for job_id in jobs:
        async with db.begin() as conn:
            rows = await output_q.oldest_beyond_tail(conn, job_id, tail=tail, most=SEGMENT_BYTES)
        if not rows:
            continue
        blob = msgspec.msgpack.encode(
            [(r["id"], r["epoch"], r["seq"], r["stream"], bytes(r["data"])) for r in rows]
        )
        sha, size = await store.put(one_chunk(blob))
        with contextlib.suppress(PackedByAnother):
            await _commit(db, job_id, rows, sha, size)
            made += 1
    return made


async def _commit(
    db: Database, job_id: int, rows: list[dict[str, Any]], sha: str, size: int
) -> None:
    first, last = rows[0]["id"], rows[-1]["id"]
    async with db.begin() as conn:
        # One packer per job at a time (two leaders may overlap for a moment).
        if await output_q.lock_and_count(conn, job_id, first=first, last=last) != len(rows):
            raise PackedByAnother
        tenant = (await jobs_q.tenants_of(conn, [job_id])).get(job_id)
        if tenant is None:
            return
        await references.reference(conn, [Ref(tenant, sha, size, "log", job_id, "service:berth")])
        await output_q.add_segment(
            conn, job_id=job_id, first_id=first, last_id=last, sha256=sha, size=size
        )


async def read(
    db: Database, store: Store | None, job_id: int, *, after: int, limit: int = 1000
) -> list[OutputChunk]:
    """The job's output after id `after`, from its segments and rows, in order."""
    async with db.begin() as conn:
        segments = await output_q.segments_after(conn, job_id, after=after)
    chunks: list[OutputChunk] = []
    cursor = after
    for segment in segments:
        if store is None:
            break
        try:
            blob = b"".join([c async for c in store.get(segment["sha256"])])
        except CasError as exc:
            # Expired with the job's other artifacts ([cas] gc_days), or lost: say so in place
            # rather than fail the whole read.
            log.warning("output_segment_unreadable", job=job_id, sha256=segment["sha256"])
            gone = f"[berth: output {segment['first_id']}..{segment['last_id']} is gone: {exc}]\n"
            chunks.append(OutputChunk(id=segment["last_id"], stream="stderr", data=gone.encode()))
        else:
            for rid, _epoch, _seq, stream, data in _decode(blob):
                if rid > cursor:
                    chunks.append(OutputChunk(id=rid, stream=stream, data=data))
        cursor = max(cursor, segment["last_id"])
        if len(chunks) >= limit:
            return chunks
    async with db.begin() as conn:
        rows = await jobs_q.output_after(conn, job_id, after=cursor, limit=limit - len(chunks))
    return chunks + rows
