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
        assert ("worker:serve", "job.finished") in actions
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
        fails naming how many, while plain `verify` cannot tell; a bad --head is one line."""
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
        asyncio.run(sql(sync_db_url, f"DELETE FROM audit WHERE seq = {int(written)}"))  # noqa: S608
        assert s.cli("audit", "verify", **env).code == 0
        bad = s.cli("audit", "verify", "--head", head, **env)
        assert bad.code == 1 and "newest 1 entries were deleted" in bad.err
        nonsense = s.cli("audit", "verify", "--head", "three:xyz", **env)
        assert (
            nonsense.code == 201 and "SEQ:HASH" in nonsense.err and "Traceback" not in nonsense.err
        )
        no_key = s.cli("audit", "verify", BERTH_HOME=str(s.home.parent / "elsewhere"), **env)
        assert no_key.code == 1 and "no secret key" in no_key.err
