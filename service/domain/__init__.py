"""Use cases.

Each public function owns its transaction (`db.begin()`), calls `db.queries` for
SQL and `core`/`auth` for rules, and records its write in the audit log in the same transaction.
"""
