"""Everything that knows SQL.

Contracts:
- `schema.py` is the one metadata Alembic compares against; every change is a migration.
- Query functions in `queries/` take the connection they run on and never commit; the domain
  layer owns transactions (`Database.begin()`).
- Time is the database's: comparisons use now()/clock_timestamp() in SQL, so every server
  sharing one Postgres agrees without clock sync.
- At most one live lease per job is the partial unique index `leases_one_live_per_job`, not a
  Python check.
"""
