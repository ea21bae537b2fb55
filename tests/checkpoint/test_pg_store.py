"""The checkpoint store contract against a real PostgreSQL server, plus what only a
shared database server has to show: pipelines isolated, one advisory lock per
job (held across processes, released when the holder dies), passwords never
shown."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from sealstream.checkpoint.stores import CheckpointStore, open_store, redact
from sealstream.checkpoint.stores.postgres import PostgresCheckpointStore, pipelines_in
from sealstream.errors import CheckpointError, LockHeldError, SpecError
from sealstream.testing.store_contract import (
    PIPELINE,
    StoreContract,
    sample_checkpoint,
)


class TestPostgresStore(StoreContract):
    @pytest.fixture(autouse=True)
    def _database(self, pg_url: str) -> None:
        self.url = pg_url

    def make_store(self, where: Path, pipeline: str = PIPELINE,
                   key: bytes | None = None) -> CheckpointStore:
        return PostgresCheckpointStore(self.url, pipeline, encryption_key=key)

    def _sql(self, sql: str, *args: object) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.url, autocommit=True) as conn:
            cur = conn.execute(sql, args)
            return cur.fetchall() if cur.description else []

    def tamper(self, store: CheckpointStore, rel: str, data: bytes | None) -> None:
        assert isinstance(store, PostgresCheckpointStore)
        if data is None:
            self._sql("DELETE FROM sealstream_checkpoint_files WHERE pipeline = %s "
                      "AND name = %s", store.pipeline, rel)
        else:
            self._sql("UPDATE sealstream_checkpoint_files SET data = %s WHERE pipeline = %s "
                      "AND name = %s", data, store.pipeline, rel)

    def stored(self, store: CheckpointStore, rel: str) -> bytes | None:
        assert isinstance(store, PostgresCheckpointStore)
        rows = self._sql("SELECT data FROM sealstream_checkpoint_files WHERE pipeline = %s "
                         "AND name = %s", store.pipeline, rel)
        return bytes(rows[0][0]) if rows else None

    def kept_aside(self, store: CheckpointStore, cid: int) -> list[bytes]:
        assert isinstance(store, PostgresCheckpointStore)
        rows = self._sql("SELECT data FROM sealstream_rejected WHERE pipeline = %s "
                         "AND id = %s AND data IS NOT NULL", store.pipeline, cid)
        return [bytes(r[0]) for r in rows]

    def pipelines_in(self, store: CheckpointStore) -> list[str] | None:
        return pipelines_in(self.url, "test database")

    def test_in_publish_commits_with_the_manifest(self, tmp_path: Path) -> None:
        store = self.make_store(tmp_path)
        store.ensure_root()
        self._sql("CREATE TABLE side (v INT)")
        files, manifest = sample_checkpoint(1)

        def boom(conn: Any) -> None:
            conn.execute("INSERT INTO side VALUES (1)")
            raise psycopg.errors.RaiseException("refused")

        with pytest.raises(CheckpointError, match="the previous checkpoints are intact"):
            store.write_checkpoint(1, files, manifest, in_publish=boom)
        assert self._sql("SELECT count(*) FROM side") == [(0,)]
        assert not store.has_manifest(1)
        store.write_checkpoint(
            1, files, manifest, in_publish=lambda c: c.execute("INSERT INTO side VALUES (2)"))
        assert self._sql("SELECT v FROM side") == [(2,)] and store.has_manifest(1)

    def test_lock_is_held_across_processes_and_freed_by_sigkill(self, tmp_path: Path) -> None:
        code = ("import sys, time\n"
                "from sealstream.checkpoint.stores.postgres import PostgresCheckpointStore\n"
                "s = PostgresCheckpointStore(sys.argv[1], 'job')\n"
                "with s.locked():\n"
                "    print('locked', flush=True)\n"
                "    time.sleep(60)\n")
        proc = subprocess.Popen([sys.executable, "-c", code, self.url],
                                stdout=subprocess.PIPE, text=True)
        try:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "locked"
            store = PostgresCheckpointStore(self.url, "job")
            with pytest.raises(LockHeldError, match=f'"pid": {proc.pid}') as err:
                with store.locked():
                    pass
            assert ":***@" in str(err.value) and ":sealstream_test@" not in str(err.value)
            proc.kill()
            proc.wait(10)
            deadline = time.monotonic() + 10
            while store.is_locked() is not None and time.monotonic() < deadline:
                time.sleep(0.05)
            with store.locked():  # the server released the dead holder's lock
                assert store.is_locked() is not None
        finally:
            proc.kill()
            proc.wait(10)
            if proc.stdout is not None:
                proc.stdout.close()


def test_urls_and_errors_never_show_the_password(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SEALSTREAM_PG_RETRY_S", "0.3")
    url = "postgresql://bob:s3cret@127.0.0.1:1/nowhere"
    assert redact(url) == "postgresql://bob:***@127.0.0.1:1/nowhere"
    assert redact("postgres://h/db?user=x&password=s3cret&x=1") == \
        "postgres://h/db?user=x&password=***&x=1"
    store = open_store(url, "p")
    assert isinstance(store, PostgresCheckpointStore)
    assert store.location == "postgresql://bob:***@127.0.0.1:1/nowhere"
    with pytest.raises(CheckpointError, match="cannot connect to") as err:
        store.ids()
    assert "s3cret" not in str(err.value)
    with pytest.raises(SpecError, match="names no server or database"):
        open_store("postgresql://", "p")
    with pytest.raises(SpecError, match="expected sqlite:///FILE, postgresql://"):
        open_store("mysql://x/y", "p")


def test_release_is_synchronous(pg_url: str) -> None:
    """When ``locked()`` returns, the lock is free: a run started right after is never
    refused (closing the connection alone lets the server release it a moment later,
    and a fresh-clone CI run under load was refused that way)."""
    first = PostgresCheckpointStore(pg_url, "job")
    second = PostgresCheckpointStore(pg_url, "job")
    first.ensure_root()
    with psycopg.connect(pg_url, autocommit=True) as admin:
        for _ in range(25):
            with first.locked():
                pass
            # pg_locks is read here, in the same instant: no waiting for the server
            assert admin.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' "
                                 "AND granted AND objsubid = 1 AND database = (SELECT oid "
                                 "FROM pg_database WHERE datname = current_database())"
                                 ).fetchone() == (0,)
            with second.locked():
                pass


def test_a_lock_lost_during_the_run_is_reported_and_fences_commits(pg_url: str) -> None:
    """The lock's session ends under a locked store: every commit (claim, publish,
    move aside, delete) and ``check_lock`` refuse with "was lost", and leaving
    ``locked()`` says so too; a new holder bumps the generation."""
    store = PostgresCheckpointStore(pg_url, "job")
    files, manifest = sample_checkpoint(1)
    with psycopg.connect(pg_url, autocommit=True) as admin:
        with pytest.raises(LockHeldError, match="its database session ended"):
            with store.locked():
                store.write_checkpoint(1, files, manifest)
                store.check_lock()
                (pid, gen), = admin.execute(
                    "SELECT backend_pid, generation FROM sealstream_lock_holders "
                    "WHERE pipeline = 'job'").fetchall()
                admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
                while admin.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s",
                                    (pid,)).fetchone() != (0,):
                    time.sleep(0.02)
                for commit in (lambda: store.write_checkpoint(2, *sample_checkpoint(2, 1)),
                               store.check_lock, lambda: store.delete(1),
                               lambda: store.move_aside(1, "test")):
                    with pytest.raises(LockHeldError, match="was lost while this run held it"):
                        commit()
                assert store.ids() == [1] and not store.has_manifest(2)
                other = PostgresCheckpointStore(pg_url, "job")
                with other.locked():  # a new run takes the lock: a new generation
                    assert admin.execute("SELECT generation FROM sealstream_lock_holders "
                                         "WHERE pipeline = 'job'").fetchone() == (gen + 1,)
                    with pytest.raises(LockHeldError, match="another run took it"):
                        store.write_checkpoint(2, *sample_checkpoint(2, 1))
                    other.write_checkpoint(2, *sample_checkpoint(2, 1))
                other.close()
    assert store.ids() == [1, 2]
    store.close()


def test_a_lost_data_connection_is_reconnected(pg_url: str) -> None:
    """Reads, writes and the publish go on after the data connection is ended."""
    store = PostgresCheckpointStore(pg_url, "job")
    with psycopg.connect(pg_url, autocommit=True) as admin, store.locked():
        store.write_checkpoint(1, *sample_checkpoint(1))
        for step in range(3):
            pid = store._db().info.backend_pid
            admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
            while admin.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s",
                                (pid,)).fetchone() != (0,):
                time.sleep(0.02)
            if step == 0:
                assert store.ids() == [1]
            elif step == 1:
                store.write_checkpoint(2, *sample_checkpoint(2, 1))
            else:
                store.delete(1)
        assert store.ids() == [2] and store.has_manifest(2)
    store.close()


def test_driver_noise_is_never_printed(pg_url: str) -> None:
    """A COPY cut by a lost connection: psycopg logs 'error ignored terminating
    Copy ...', which Python prints on stderr unless the logger has a handler."""
    code = ("import sys, time, psycopg\n"
            "from sealstream.checkpoint.stores.postgres import connect\n"
            "conn = connect(sys.argv[1], 'db')\n"
            "conn.execute('CREATE TEMP TABLE t (v INT)')\n"
            "admin = psycopg.connect(sys.argv[1], autocommit=True)\n"
            "pid = conn.info.backend_pid\n"
            "try:\n"
            "    with conn.cursor().copy('COPY t (v) FROM STDIN') as copy:\n"
            "        admin.execute('SELECT pg_terminate_backend(%s)', (pid,))\n"
            "        while admin.execute('SELECT count(*) FROM pg_stat_activity '\n"
            "                            'WHERE pid = %s', (pid,)).fetchone() != (0,):\n"
            "            time.sleep(0.02)\n"
            "        raise RuntimeError('cut')\n"
            "except RuntimeError:\n"
            "    print('cut', flush=True)\n")
    res = subprocess.run([sys.executable, "-c", code, pg_url], capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 0 and res.stdout == "cut\n", res.stderr
    assert res.stderr == ""
