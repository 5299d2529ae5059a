"""The hot paths' statements, run straight on asyncpg in a transaction from the same pool.

Why: SQLAlchemy's per-call machinery. On this machine a statement through its AsyncConnection
costs 160 µs of CPU against asyncpg's 33 µs, and a transaction of one statement 396 µs against
61 µs (bench/ANALYSIS.md). A submit is two statements, a dispatch pass four to six, a report
flush three: that overhead was a third of the server's CPU on them.

The statements stay what every query writes: `sql("... :name ...")` (db/statements.py). Each is
compiled once by SQLAlchemy's own asyncpg compiler into asyncpg's `$n` form, so a query
function runs unchanged on either connection. Values pass to asyncpg as they would through
SQLAlchemy's textual statements (which process nothing), and the type codecs are the ones
SQLAlchemy set on the connection (jsonb as JSON text in, Python values out), so both paths
read and write the same values.
"""

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import asyncpg
from sqlalchemy import TextClause
from sqlalchemy.dialects.postgresql.asyncpg import dialect as asyncpg_dialect
from sqlalchemy.ext.asyncio import AsyncConnection

_DIALECT = asyncpg_dialect()  # type: ignore[no-untyped-call]
_COMPILED: dict[int, tuple[TextClause, str, tuple[str, ...]]] = {}


def _compiled(clause: TextClause) -> tuple[str, tuple[str, ...]]:
    """The `$n` form of a textual statement and its parameters' names, in order."""
    # Keyed by identity: statements come from sql()'s cache, so there are few; the clause is
    # kept in the entry so its id is never reused for another.
    hit = _COMPILED.get(id(clause))
    if hit is None or hit[0] is not clause:
        compiled = clause.compile(dialect=_DIALECT)
        hit = _COMPILED[id(clause)] = (clause, compiled.string, tuple(compiled.positiontup or ()))
    return hit[1], hit[2]


class Row:
    """A result row read the way queries read SQLAlchemy's: by attribute, index or mapping."""

    __slots__ = ("_mapping",)

    def __init__(self, record: asyncpg.Record) -> None:
        self._mapping = record

    def __getattr__(self, name: str) -> Any:  # noqa: ANN401  (a column's value)
        try:
            return self._mapping[name]
        except KeyError:
            raise AttributeError(name) from None

    def __getitem__(self, index: int) -> Any:  # noqa: ANN401
        return self._mapping[index]

    def __iter__(self) -> Iterator[Any]:
        return iter(self._mapping.values())

    def __len__(self) -> int:
        return len(self._mapping)


class Rows:
    """The rows of one statement, with the part of SQLAlchemy's Result the queries use."""

    __slots__ = ("_rows",)

    def __init__(self, records: Sequence[asyncpg.Record]) -> None:
        self._rows = [Row(r) for r in records]

    def all(self) -> list[Row]:
        return self._rows

    def __iter__(self) -> Iterator[Row]:
        return iter(self._rows)

    def first(self) -> Row | None:
        return self._rows[0] if self._rows else None

    def one_or_none(self) -> Row | None:
        if len(self._rows) > 1:
            raise ValueError("more than one row where at most one was expected")
        return self.first()

    def one(self) -> Row:
        if len(self._rows) != 1:
            raise ValueError(f"{len(self._rows)} rows where exactly one was expected")
        return self._rows[0]

    def scalar(self) -> Any:  # noqa: ANN401
        return self._rows[0][0] if self._rows else None

    def scalar_one(self) -> Any:  # noqa: ANN401
        return self.one()[0]

    def scalar_one_or_none(self) -> Any:  # noqa: ANN401
        row = self.one_or_none()
        return None if row is None else row[0]


class DriverConnection:
    """An asyncpg connection in a transaction, executing the queries' textual statements."""

    def __init__(self, raw: asyncpg.Connection, info: dict[str, Any]) -> None:
        self.raw = raw
        self.info = info  # what SQLAlchemy's connection.info holds for the queries (audit key)

    async def execute(self, clause: TextClause, params: Mapping[str, Any] | None = None) -> Rows:
        """Run one statement; its rows (none for a statement that returns none)."""
        text, names = _compiled(clause)
        args = [params[n] for n in names] if params else []
        return Rows(await self.raw.fetch(text, *args))


# What a query function that runs on both paths takes.
Conn = AsyncConnection | DriverConnection
