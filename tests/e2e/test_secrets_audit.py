"""Secrets (AES-GCM at rest, in leases only, redacted) and the hash-chained audit log."""

import asyncio
import json

import asyncpg

from service.db.engine import plain_url
from tests.procs import wait_for

VALUE = "s3cr3t-VALUE-9f8e7d"


async def sql(url: str, statement: str) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(plain_url(url))
    try:
        return await conn.fetch(statement)
    finally:
        await conn.close()


class TestSecrets:
    def test_secret_reaches_the_job_and_nowhere_else(self, server_factory, sync_db_url, tmp_path):
        """A job gets its secret as a variable; output, listings, audit and logs never show it."""
        s = server_factory()
        src = tmp_path / "v"
        src.write_text(VALUE + "\n")
        assert (
            s.cli("secret", "set", "api-key", "--from-file", str(src), "--tenant", "default").code
            == 0
        )
        r = s.cli(
            "job",
            "submit",
            "--wait",
            "--secret",
            "API_KEY=api-key",
            "--",
            "sh",
            "-c",
            'echo "key=$API_KEY"; test "$API_KEY" = "' + VALUE + '"',
        )
        assert r.code == 0, r.err  # the job saw the real value ...
        assert r.out == "key=***\n"  # ... and its captured output is redacted
        listing = s.cli("secret", "list", "--json")
        assert listing.code == 0 and "api-key" in listing.out and VALUE not in listing.out
        audit = s.api("GET", "/api/v1/audit", params={"limit": 1000}).text
        assert "secret.set" in audit and VALUE not in audit
        rows = asyncio.run(sql(sync_db_url, "SELECT ciphertext FROM secrets"))
        assert VALUE.encode() not in rows[0]["ciphertext"]
        assert VALUE not in s.log()
        assert s.cli("secret", "rm", "api-key", "--tenant", "default").code == 0
        r = s.cli("job", "submit", "--secret", "API_KEY=api-key", "--", "true")
        assert r.code != 0 and "no secret 'api-key'" in r.err

    def test_secret_key_file_is_private(self, server_factory):
        """Without BERTH_SECRET_KEY the key lives in $BERTH_HOME/secret.key, mode 0600."""
        s = server_factory()
        mode = (s.home / "secret.key").stat().st_mode & 0o777
        assert mode == 0o600


class TestAudit:
    def test_writes_are_signed_and_the_chain_verifies(self, server_factory, sync_db_url):
        """Writes carry their caller; verify passes, then names an edited and a deleted entry."""
        s = server_factory()
        assert s.cli("job", "submit", "--wait", "--", "true").code == 0
        s.worker_token("w1")
        assert s.cli("token", "revoke", "w1").code == 0
        entries = json.loads(s.cli("audit", "list", "--json").out)
        actions = {(e["caller"], e["action"]) for e in entries}
        assert ("human:admin", "job.submitted") in actions
        assert ("human:admin", "token.created") in actions
        assert any(c.startswith("worker:serve-") and a == "job.finished" for c, a in actions)
        wait_for(
            lambda: all(e["seq"] for e in json.loads(s.cli("audit", "list", "--json").out)),
            10,
            "entries to be sealed",
        )
        env = {"BERTH_DATABASE_URL": sync_db_url}
        ok = s.cli("audit", "verify", **env)
        assert ok.code == 0 and "intact" in ok.out, ok.err
        asyncio.run(sql(sync_db_url, "UPDATE audit SET caller = 'human:mallory' WHERE seq = 3"))
        bad = s.cli("audit", "verify", **env)
        assert bad.code == 1 and "seq 3" in bad.err and "altered" in bad.err
        asyncio.run(sql(sync_db_url, "UPDATE audit SET caller = 'human:admin' WHERE seq = 3"))
        asyncio.run(sql(sync_db_url, "DELETE FROM audit WHERE seq = 2"))
        gone = s.cli("audit", "verify", **env)
        assert gone.code == 1 and "seq 2 is missing" in gone.err

    def test_head_catches_a_truncated_tail(self, server_factory, sync_db_url):
        """`audit head` prints SEQ:HASH; after the newest entries are deleted, `verify --head`
        fails naming how many, and so does plain `verify` where the server runs (its kept head);
        elsewhere plain `verify` cannot tell; a bad --head is one line."""
        s = server_factory(builtin_worker=False)
        for i in range(3):
            s.worker_token(f"w{i}")
        env = {"BERTH_DATABASE_URL": sync_db_url}
        written = len(json.loads(s.cli("audit", "list", "--json").out))  # admin token + 3
        assert written == 4
        wait_for(
            lambda: s.cli("audit", "head", **env).out.startswith(f"{written}:"), 10, "all sealed"
        )
        head = s.cli("audit", "head", **env).out.strip()
        assert head == (s.log().split('"head": "')[-1].split('"')[0])  # the same as logged
        assert s.cli("audit", "verify", "--head", head, **env).code == 0
        kept = s.home / "audit.head"
        wait_for(lambda: kept.exists() and kept.read_text() == head, 10, "the kept head")
        assert oct(kept.stat().st_mode & 0o777) == "0o600"
        asyncio.run(sql(sync_db_url, f"DELETE FROM audit WHERE seq = {int(written)}"))  # noqa: S608
        elsewhere = s.home.parent / "elsewhere"
        elsewhere.mkdir()
        key = {"BERTH_SECRET_KEY": (s.home / "secret.key").read_text().strip()}
        assert s.cli("audit", "verify", BERTH_HOME=str(elsewhere), **key, **env).code == 0
        here = s.cli("audit", "verify", **env)
        assert here.code == 1 and "newest 1 entries were deleted" in here.err
        bad = s.cli("audit", "verify", "--head", head, **env)
        assert bad.code == 1 and "newest 1 entries were deleted" in bad.err
        nonsense = s.cli("audit", "verify", "--head", "three:xyz", **env)
        assert (
            nonsense.code == 201 and "SEQ:HASH" in nonsense.err and "Traceback" not in nonsense.err
        )
        no_key = s.cli("audit", "verify", BERTH_HOME=str(elsewhere), **env)
        assert no_key.code == 1 and "no secret key" in no_key.err

    def test_a_chain_rewritten_without_the_key_fails_with_no_flags(
        self, server_factory, sync_db_url
    ):
        """A database writer recomputes the whole chain as plain SHA-256 and deletes the keyed
        anchor: `berth audit verify` where the server runs fails with no flags. A row it
        inserts is never sealed: the server names it, and so does verify."""
        from service.core import audit_chain

        s = server_factory(builtin_worker=False)
        for i in range(3):
            s.worker_token(f"w{i}")
        kept = s.home / "audit.head"
        wait_for(lambda: kept.exists() and kept.read_text().startswith("4:"), 10, "all sealed")
        env = {"BERTH_DATABASE_URL": sync_db_url}
        assert s.cli("audit", "verify", **env).code == 0

        async def rewrite() -> None:
            conn = await asyncpg.connect(plain_url(sync_db_url))
            try:
                rows = await conn.fetch("SELECT * FROM audit WHERE seq IS NOT NULL ORDER BY seq")
                previous = audit_chain.GENESIS
                for row in rows:
                    entry = dict(row)
                    entry["detail"] = json.loads(entry["detail"])
                    previous = audit_chain.link(previous, row["seq"], entry)  # no key
                    await conn.execute(
                        "UPDATE audit SET hash = $1 WHERE seq = $2", previous, row["seq"]
                    )
                await conn.execute("DELETE FROM audit_anchor")
            finally:
                await conn.close()

        asyncio.run(rewrite())
        r = s.cli("audit", "verify", **env)
        assert r.code == 1 and "anchor is gone" in r.err, r.err
        # The server does not re-anchor the rewritten chain (which would pass it off as
        # "sealed before keys"): it says so and stops sealing.
        wait_for(lambda: "keyed anchor is gone" in s.log(), 10, "the sealer to refuse")
        assert asyncio.run(sql(sync_db_url, "SELECT count(*) AS n FROM audit_anchor"))[0]["n"] == 0

    def test_an_entry_a_database_writer_inserts_is_named(self, server_factory, sync_db_url):
        """A row written straight into the audit table is left out of the chain, the server's
        log names it, and `audit verify` fails naming it."""
        s = server_factory(builtin_worker=False)
        forged = asyncio.run(
            sql(
                sync_db_url,
                "INSERT INTO audit (caller, action, target) "
                "VALUES ('human:admin', 'token.created', 'backdoor') RETURNING id",
            )
        )[0]["id"]
        s.worker_token("w1")
        wait_for(lambda: "audit_entries_not_signed" in s.log(), 10, "the sealer to name it")
        wait_for(
            lambda: all(
                e["seq"]
                for e in json.loads(s.cli("audit", "list", "--json").out)
                if e["id"] != forged
            ),
            10,
            "the server's own entries sealed",
        )
        r = s.cli("audit", "verify", BERTH_DATABASE_URL=sync_db_url)
        assert r.code == 1 and str(forged) in r.err and "not written by a berth server" in r.err
