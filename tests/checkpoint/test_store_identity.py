"""A store is one store however it is reached, and it trusts nothing planted in it.

* The run lock belongs to the store's identity, not to the path as given: a SQLite
  database reached through a symbolic link, another spelling of its path or a hard link,
  and a checkpoint directory reached through a link, are locked by one run only.
* A symbolic link (or a hard link) planted at the lock file is refused, never followed:
  its target is left untouched.
* A checkpoint directory (or SQLite database) owned by another user, or writable by
  group or others, is refused for a run with a message saying what to do.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from sealstream.checkpoint.stores import LocalCheckpointStore, open_store
from sealstream.checkpoint.stores.sqlite import SqliteCheckpointStore
from sealstream.errors import CheckpointError, LockHeldError

HOLD = """
import sys
from pathlib import Path
from sealstream.checkpoint.stores import open_store
store = open_store(sys.argv[1], "job", Path(sys.argv[2]))
with store.locked():
    print("locked", flush=True)
    sys.stdin.read()
"""


def _hold(where: str, base: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", HOLD, where, str(base)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "locked"
    return proc


def _release(proc: subprocess.Popen[str]) -> None:
    assert proc.stdin is not None
    proc.stdin.close()
    assert proc.wait(30) == 0
    if proc.stdout is not None:
        proc.stdout.close()


def _other_name(tmp_path: Path, how: str, real: Path) -> str:
    """Another name of ``real`` (a file or a directory), relative to ``tmp_path``."""
    if how == "symlink":
        (tmp_path / "link").symlink_to(real)
        return "link"
    if how == "hard link":
        os.link(real, tmp_path / "hard")
        return "hard"
    (tmp_path / "sub").mkdir()
    return f"./sub/../{real.name}"  # another spelling


@pytest.mark.parametrize("how", ["symlink", "spelling"])
def test_a_sqlite_database_reached_by_two_names_is_locked_once(tmp_path: Path, how: str) -> None:
    real = tmp_path / "ckpt.db"
    SqliteCheckpointStore(real, "job").ensure_root()
    other = _other_name(tmp_path, how, real)
    proc = _hold(f"sqlite:///{other}", tmp_path)
    try:
        store = open_store("sqlite:///ckpt.db", "job", tmp_path)
        with pytest.raises(LockHeldError, match=f'"pid": {proc.pid}'):
            with store.locked():
                pass
        assert store.is_locked() is not None
        other_job = open_store(f"sqlite:///{other}", "other-job", tmp_path)
        with other_job.locked():  # another pipeline of the same database is not blocked
            pass
        other_job.close()
    finally:
        _release(proc)
    with store.locked():  # free again once the holder is gone
        assert store.is_locked() is not None
    assert store.is_locked() is None
    store.close()


def test_a_hard_linked_sqlite_database_is_refused_by_either_name(tmp_path: Path) -> None:
    """SQLite keeps a write-ahead log per name: through a hard link, one run's commits are
    invisible to a run through the other name, so neither name may be used by a run."""
    real = tmp_path / "ckpt.db"
    SqliteCheckpointStore(real, "job").ensure_root()
    os.link(real, tmp_path / "hard.db")
    for name in ("ckpt.db", "hard.db"):
        store = open_store(f"sqlite:///{name}", "job", tmp_path)
        with pytest.raises(CheckpointError, match="has 2 names .hard links.*remove the other"):
            with store.locked():
                pass
        store.close()
    (tmp_path / "hard.db").unlink()
    with open_store("sqlite:///ckpt.db", "job", tmp_path).locked():
        pass


def test_a_sqlite_database_locked_through_a_hard_link_is_locked(tmp_path: Path) -> None:
    """The lock is on the file itself: a run that got the lock before a second name was
    made still holds it against that name."""
    real = tmp_path / "ckpt.db"
    SqliteCheckpointStore(real, "job").ensure_root()
    proc = _hold("sqlite:///ckpt.db", tmp_path)
    try:
        os.link(real, tmp_path / "hard.db")
        store = SqliteCheckpointStore(tmp_path / "hard.db", "job")
        assert store.is_locked() is not None
        store.close()
    finally:
        _release(proc)


def test_one_process_cannot_lock_a_database_twice_through_two_names(tmp_path: Path) -> None:
    real = tmp_path / "ckpt.db"
    (tmp_path / "link.db").symlink_to(real)
    a = SqliteCheckpointStore(real, "job")
    b = SqliteCheckpointStore(tmp_path / "link.db", "job")
    with a.locked():
        with pytest.raises(LockHeldError, match=str(os.getpid())):
            with b.locked():
                pass
    with b.locked():
        pass
    a.close()
    b.close()


@pytest.mark.parametrize("how", ["symlink", "spelling"])
def test_a_checkpoint_directory_reached_by_two_names_is_locked_once(
    tmp_path: Path, how: str
) -> None:
    real = tmp_path / "ckpt"
    LocalCheckpointStore(real).ensure_root()
    proc = _hold(str(tmp_path / _other_name(tmp_path, how, real)), tmp_path)
    try:
        with pytest.raises(LockHeldError, match=f'"pid": {proc.pid}'):
            with LocalCheckpointStore(real).locked():
                pass
    finally:
        _release(proc)


@pytest.mark.parametrize("kind", ["symlink", "hard link"])
def test_a_link_planted_at_the_lock_is_refused_and_its_target_untouched(
    tmp_path: Path, kind: str
) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir(mode=0o700)
    victim = tmp_path / "secret"
    victim.write_bytes(b"precious\n")
    victim.chmod(0o600)
    if kind == "symlink":
        (ckpt / "LOCK").symlink_to(victim)
        match = "is a symbolic link"
    else:
        os.link(victim, ckpt / "LOCK")
        match = "has other hard links"
    with pytest.raises(CheckpointError, match=match):
        with LocalCheckpointStore(ckpt).locked():
            pass
    assert victim.read_bytes() == b"precious\n"
    assert LocalCheckpointStore(ckpt).is_locked() is None


def test_a_run_on_a_lock_symlink_fails_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from sealstream.cli import main

    ckpt = tmp_path / "ckpt"
    ckpt.mkdir(mode=0o700)
    victim = tmp_path / "secret"
    victim.write_bytes(b"precious\n")
    (ckpt / "LOCK").symlink_to(victim)
    spec = tmp_path / "spec.toml"
    (tmp_path / "in.jsonl").write_text('{"user": "a", "ts": 1}\n')
    spec.write_text('[pipeline]\nname = "j"\n[source]\nkind = "jsonl"\npaths = ["in.jsonl"]\n'
                    'key = "user"\ntime = "ts"\n[watermark]\nmax_delay_ms = 0\n'
                    '[window]\nkind = "tumbling"\nsize_ms = 10\n[aggregates]\nn = "count"\n'
                    '[sink]\nkind = "jsonl"\npath = "out"\n[checkpoint]\npath = "ckpt"\n')
    assert main(["run", str(spec), "--quiet"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "LOCK is a symbolic link" in err[0], err
    assert victim.read_bytes() == b"precious\n"


def test_a_checkpoint_directory_writable_by_others_is_refused(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    ckpt.chmod(0o777)
    with pytest.raises(CheckpointError, match=r"writable by others \(mode 0777\).*chmod go-w"):
        with LocalCheckpointStore(ckpt).locked():
            pass
    assert not (ckpt / "LOCK").exists()
    ckpt.chmod(0o770)
    with pytest.raises(CheckpointError, match="writable by its group"):
        LocalCheckpointStore(ckpt).ensure_root()
    ckpt.chmod(0o755)  # readable by others is fine (checkpoints may be encrypted)
    with LocalCheckpointStore(ckpt).locked():
        pass


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")


@needs_root
def test_a_checkpoint_directory_owned_by_another_user_is_refused(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir(mode=0o700)
    os.chown(ckpt, 65534, 65534)
    with pytest.raises(CheckpointError, match="owned by another user"):
        with LocalCheckpointStore(ckpt).locked():
            pass
    assert not (ckpt / "LOCK").exists()


def test_a_sqlite_database_writable_by_others_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "ckpt.db"
    store = SqliteCheckpointStore(db, "job")
    store.ensure_root()
    db.chmod(0o666)
    with pytest.raises(CheckpointError, match="writable by group or others.*chmod go-w"):
        with store.locked():
            pass
    db.chmod(0o644)
    with store.locked():
        pass
    store.close()


@needs_root
def test_a_sqlite_database_owned_by_another_user_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "ckpt.db"
    store = SqliteCheckpointStore(db, "job")
    store.ensure_root()
    os.chown(db, 65534, 65534)
    with pytest.raises(CheckpointError, match="owned by another user"):
        with store.locked():
            pass
    store.close()


# ---------------------------------------------------------------- table names
OLD_SCHEMA = """
CREATE TABLE checkpoints (pipeline TEXT NOT NULL, id INTEGER NOT NULL, created TEXT NOT NULL,
    PRIMARY KEY (pipeline, id));
CREATE TABLE checkpoint_files (pipeline TEXT NOT NULL, id INTEGER NOT NULL, name TEXT NOT NULL,
    data BLOB NOT NULL, PRIMARY KEY (pipeline, name));
CREATE INDEX checkpoint_files_by_id ON checkpoint_files (pipeline, id);
CREATE TABLE rejected (seq INTEGER PRIMARY KEY AUTOINCREMENT, pipeline TEXT NOT NULL,
    id INTEGER NOT NULL, reason TEXT NOT NULL, moved_at TEXT NOT NULL, name TEXT, data BLOB);
"""


def _tables(db: Path) -> set[str]:
    conn = sqlite3.connect(db)
    try:
        return {r[0] for r in conn.execute(
            "SELECT name FROM sqlite_master WHERE type IN ('table', 'index') "
            "AND name NOT LIKE 'sqlite_%'")}
    finally:
        conn.close()


def test_the_sqlite_store_keeps_to_prefixed_tables(tmp_path: Path) -> None:
    db = tmp_path / "results.db"
    store = SqliteCheckpointStore(db, "job")
    store.write_checkpoint(1, {"state.arrow": b"s"}, b"{}")
    store.close()
    assert _tables(db) == {"sealstream_checkpoints", "sealstream_checkpoint_files",
                           "sealstream_checkpoint_files_by_id", "sealstream_rejected",
                           "sealstream_lock_holders"}


def test_a_database_of_the_old_layout_is_migrated_in_place(tmp_path: Path) -> None:
    db = tmp_path / "ckpt.db"
    conn = sqlite3.connect(db)
    conn.executescript(OLD_SCHEMA)
    conn.execute("INSERT INTO checkpoints VALUES ('job', 1, 't'), ('job', 2, 't')")
    conn.execute("INSERT INTO checkpoint_files VALUES ('job', 1, 'cp-000000000001/x', X'01'), "
                 "('job', 2, 'cp-000000000002/x', X'02')")
    conn.execute("INSERT INTO rejected (pipeline, id, reason, moved_at, name, data) "
                 "VALUES ('job', 0, 'r', 't', 'cp-000000000000/x', X'00')")
    conn.execute("CREATE TABLE mine (v)")  # the user's own table stays as it is
    conn.commit()
    conn.close()
    store = SqliteCheckpointStore(db, "job")
    assert store.ids() == [1, 2]
    assert store.read("cp-000000000002/x") == b"\x02"
    assert store.max_id_ever() == 2
    assert store.rejected() == [{"id": 0, "reason": "r", "moved_at": "t", "files": 1}]
    store.move_aside(1, "test")  # AUTOINCREMENT goes on after the rename
    assert [r["id"] for r in store.rejected()] == [0, 1]
    store.close()
    assert _tables(db) == {"sealstream_checkpoints", "sealstream_checkpoint_files",
                           "sealstream_checkpoint_files_by_id", "sealstream_rejected",
                           "sealstream_lock_holders", "mine"}
    from sealstream.checkpoint.stores.sqlite import pipelines_in

    assert pipelines_in(db) == ["job"]


def test_tables_that_only_share_an_old_name_are_left_alone(tmp_path: Path) -> None:
    from sealstream.checkpoint.stores.sqlite import migrate

    db = tmp_path / "results.db"
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("CREATE TABLE checkpoints (run TEXT, at TEXT)")  # the user's, not ours
    conn.execute("INSERT INTO checkpoints VALUES ('mine', 'now')")
    assert migrate(conn) == []
    conn.close()
    store = SqliteCheckpointStore(db, "job")
    assert store.ids() == []
    store.close()
    conn = sqlite3.connect(db)
    assert conn.execute("SELECT * FROM checkpoints").fetchall() == [("mine", "now")]
    conn.close()
