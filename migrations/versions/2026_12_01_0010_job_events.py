"""Job events: NOTIFY berth_job_events_v1 with a job's id when its state or output changes.

Why: `job logs --follow`, `job wait` and `--wait` follow a stream from the server
(GET /api/v1/jobs/{id}/events) that is woken by this NOTIFY instead of polling, so a follower
costs the database nothing while its job is silent. Triggers, not calls in each transaction:
every path that moves a job (lease, report, cancel, expiry, requeue) is covered, including ones
added later. Statement-level with transition tables: one NOTIFY per job per statement, and
Postgres folds identical payloads within a transaction, so a burst of output is one wake-up.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01 15:40:00
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute(
        """
        CREATE FUNCTION berth_job_moved() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            PERFORM pg_notify('berth_job_events_v1', n.id::text)
            FROM new_rows n JOIN old_rows o ON o.id = n.id
            WHERE (n.state, n.worker, n.attempt, n.exit_code)
                  IS DISTINCT FROM (o.state, o.worker, o.attempt, o.exit_code);
            RETURN NULL;
        END $$
        """
    )
    op.execute(
        """
        CREATE TRIGGER jobs_moved AFTER UPDATE ON jobs
        REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
        FOR EACH STATEMENT EXECUTE FUNCTION berth_job_moved()
        """
    )
    op.execute(
        """
        CREATE FUNCTION berth_job_wrote() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            PERFORM pg_notify('berth_job_events_v1', j.job_id::text)
            FROM (SELECT DISTINCT job_id FROM new_rows) j;
            RETURN NULL;
        END $$
        """
    )
    op.execute(
        """
        CREATE TRIGGER job_output_wrote AFTER INSERT ON job_output
        REFERENCING NEW TABLE AS new_rows
        FOR EACH STATEMENT EXECUTE FUNCTION berth_job_wrote()
        """
    )


def downgrade() -> None:
    op.execute("DROP TRIGGER IF EXISTS job_output_wrote ON job_output")
    op.execute("DROP FUNCTION IF EXISTS berth_job_wrote()")
    op.execute("DROP TRIGGER IF EXISTS jobs_moved ON jobs")
    op.execute("DROP FUNCTION IF EXISTS berth_job_moved()")
