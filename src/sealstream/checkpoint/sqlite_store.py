"""A checkpoint store in one SQLite database file (stdlib ``sqlite3``, WAL).

Selected by ``[checkpoint] url = "sqlite:///ckpt.db"`` (relative to the spec's
directory; ``sqlite:////abs/ckpt.db`` for an absolute path). Several jobs may
share one database: every row carries the pipeline name and a store only ever
sees its own pipeline's rows.

Tables::

    checkpoints(pipeline, id, created)            one row per checkpoint id in use
    checkpoint_files(pipeline, id, name, data)    every blob, the manifest included,
                                                  named as in a checkpoint directory
                                                  (``cp-000000000012/state.arrow``)
    rejected(seq, pipeline, id, reason, moved_at, name, data)
                                                  checkpoints moved aside: kept, never
                                                  deleted

Protocol: the ``checkpoints`` row is inserted first (an INSERT that fails when the
id is taken: create-if-absent), then each file in its own committed transaction,
then the manifest row in a last transaction that fails when a manifest exists:
**that commit is the publish**. A crash before it leaves a checkpoint without a
manifest (partial, ``NO_MANIFEST``), exactly like a directory without
``MANIFEST.json``. ``synchronous=FULL`` makes every commit durable. Moving aside
and deleting are one transaction each, so no half-deleted checkpoint exists.

Lock: one writer per job is enforced with an OS lock (``fcntl.flock``) on a
sidecar file ``<db>.lock.<pipeline>`` next to the database, which holds the
holder's pid, host and start time. A lock held by an open SQLite transaction
for the job's lifetime would block every other job sharing the file (and WAL
checkpointing), so the database itself is never locked longer than one write.
Like the directory store's lock, it is released when the process dies.

Encryption at rest works as in the directory store: each blob is an AES-256-GCM
envelope bound to its name.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import sqlite3
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from sealstream.checkpoint import crypto
from sealstream.checkpoint._sqlite_tx import immediate as immediate  # re-exported
from sealstream.checkpoint.manifest import MANIFEST_NAME
from sealstream.checkpoint.store import (
    CheckpointStore,
    checkpoint_dirname,
    file_lock_holder,
    hold_file_lock,
)
from sealstream.errors import CheckpointError
from sealstream.sinks._files import os_reason

SCHEMA = """
CREATE TABLE IF NOT EXISTS checkpoints (
    pipeline TEXT NOT NULL,
    id INTEGER NOT NULL,
    created TEXT NOT NULL,
    PRIMARY KEY (pipeline, id)
);
CREATE TABLE IF NOT EXISTS checkpoint_files (
    pipeline TEXT NOT NULL,
    id INTEGER NOT NULL,
    name TEXT NOT NULL,
    data BLOB NOT NULL,
    PRIMARY KEY (pipeline, name)
);
CREATE INDEX IF NOT EXISTS checkpoint_files_by_id ON checkpoint_files (pipeline, id);
CREATE TABLE IF NOT EXISTS rejected (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    pipeline TEXT NOT NULL,
    id INTEGER NOT NULL,
    reason TEXT NOT NULL,
    moved_at TEXT NOT NULL,
    name TEXT,
    data BLOB
);
"""


def _stamp() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def lock_path(db: Path, pipeline: str) -> Path:
    """The sidecar lock file of ``pipeline`` in database ``db``."""
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", pipeline)[:64]
    tag = hashlib.sha256(pipeline.encode()).hexdigest()[:8]
    return db.with_name(f"{db.name}.lock.{safe}-{tag}")


def pipelines_in(db: Path) -> list[str]:
    """The pipeline names with checkpoints (present or rejected) in ``db``."""
    if not db.is_file():
        return []
    try:
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        try:
            rows = conn.execute(
                "SELECT pipeline FROM checkpoints UNION SELECT pipeline FROM rejected"
            ).fetchall()
        finally:
            conn.close()
    except sqlite3.Error as exc:
        raise CheckpointError(f"cannot read checkpoint database {db}: {exc}") from None
    return sorted(str(r[0]) for r in rows)


class SqliteCheckpointStore(CheckpointStore):
    """The checkpoints of pipeline ``pipeline`` in SQLite database ``db``."""

    def __init__(self, db: Path, pipeline: str,
                 encryption_key: bytes | None | object = crypto.FROM_ENV) -> None:
        self.root = Path(db)
        self.pipeline = pipeline
        self._conn: sqlite3.Connection | None = None
        self._init_key(encryption_key)

    @property
    def location(self) -> str:
        return f"sqlite:///{self.root}"

    # ------------------------------------------------------------ connection
    def _db(self, create: bool = False) -> sqlite3.Connection | None:
        if self._conn is None:
            if not create and not self.root.is_file():
                return None
            try:
                if create:
                    self.root.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
                    if not self.root.exists():
                        fd = os.open(self.root, os.O_WRONLY | os.O_CREAT, 0o600)
                        os.close(fd)
                conn = sqlite3.connect(self.root, isolation_level=None, timeout=30.0,
                                       check_same_thread=False)
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute("PRAGMA synchronous=FULL")
                conn.executescript(SCHEMA)
            except OSError as exc:
                raise CheckpointError(
                    f"cannot open checkpoint database {self.root}: {os_reason(exc)}"
                ) from None
            except sqlite3.Error as exc:
                raise CheckpointError(
                    f"cannot open checkpoint database {self.root}: {exc}"
                ) from None
            self._conn = conn
        return self._conn

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _query(self, sql: str, *args: Any) -> list[tuple[Any, ...]]:
        conn = self._db()
        if conn is None:
            return []
        try:
            return list(conn.execute(sql, (self.pipeline, *args)).fetchall())
        except sqlite3.Error as exc:
            raise CheckpointError(f"cannot read checkpoint database {self.root}: {exc}") from None

    # ------------------------------------------------------------ reading
    def exists(self) -> bool:
        return self.root.is_file()

    def ids(self) -> list[int]:
        return [int(r[0]) for r in
                self._query("SELECT id FROM checkpoints WHERE pipeline = ? ORDER BY id")]

    def max_id_ever(self) -> int:
        rows = self._query(
            "SELECT MAX(id) FROM (SELECT id FROM checkpoints WHERE pipeline = ?1 "
            "UNION ALL SELECT id FROM rejected WHERE pipeline = ?1)"
        )
        return int(rows[0][0]) if rows and rows[0][0] is not None else 0

    def _raw(self, rel: str) -> bytes | None:
        rows = self._query(
            "SELECT data FROM checkpoint_files WHERE pipeline = ? AND name = ?", rel)
        return bytes(rows[0][0]) if rows else None

    def _names(self, cid: int) -> list[str]:
        return [str(r[0]) for r in self._query(
            "SELECT name FROM checkpoint_files WHERE pipeline = ? AND id = ? ORDER BY name",
            cid)]

    def rejected(self) -> list[dict[str, Any]]:
        """The checkpoints moved aside (evidence), oldest move first."""
        rows = self._query(
            "SELECT id, reason, moved_at, COUNT(name) FROM rejected WHERE pipeline = ? "
            "GROUP BY id, reason, moved_at ORDER BY MIN(seq)")
        return [{"id": int(r[0]), "reason": r[1], "moved_at": r[2], "files": int(r[3])}
                for r in rows]

    # ------------------------------------------------------------ writing
    def ensure_root(self) -> None:
        self._db(create=True)

    transactional = True

    def write_checkpoint(self, cid: int, files: dict[str, bytes], manifest: bytes,
                         crash: Any = None,
                         in_publish: Callable[[Any], None] | None = None) -> None:
        conn = self._db(create=True)
        assert conn is not None
        d = checkpoint_dirname(cid)
        mrel = f"{d}/{MANIFEST_NAME}"
        claimed = False
        try:
            conn.execute("INSERT INTO checkpoints (pipeline, id, created) VALUES (?, ?, ?)",
                         (self.pipeline, cid, _stamp()))
            claimed = True
            for name, data in files.items():
                rel = f"{d}/{name}"
                conn.execute(
                    "INSERT INTO checkpoint_files (pipeline, id, name, data) VALUES (?, ?, ?, ?)",
                    (self.pipeline, cid, rel, self._seal(rel, data)))
                if crash is not None:
                    crash(f"after_write_{name.split('.')[0]}")
            sealed = self._seal(mrel, manifest)
            if crash is not None:
                crash("before_manifest_publish")
            # the publish: one committed transaction whose INSERT fails if present
            with immediate(conn):
                if in_publish is not None:
                    in_publish(conn)
                conn.execute(
                    "INSERT INTO checkpoint_files (pipeline, id, name, data) "
                    "VALUES (?, ?, ?, ?)", (self.pipeline, cid, mrel, sealed))
        except sqlite3.Error as exc:
            if claimed and not conn.in_transaction and self._raw(mrel) is None:
                with contextlib.suppress(sqlite3.Error):
                    self._drop(conn, cid)
            what = "already exists" if isinstance(exc, sqlite3.IntegrityError) else str(exc)
            raise CheckpointError(
                f"cannot write checkpoint {cid} in {self.location}: {what}; "
                "the previous checkpoints are intact"
            ) from None

    def _drop(self, conn: sqlite3.Connection, cid: int) -> None:
        with immediate(conn):
            conn.execute("DELETE FROM checkpoint_files WHERE pipeline = ? AND id = ?",
                         (self.pipeline, cid))
            conn.execute("DELETE FROM checkpoints WHERE pipeline = ? AND id = ?",
                         (self.pipeline, cid))

    def move_aside(self, cid: int, reason: str) -> str | None:
        """Move checkpoint ``cid``'s rows to ``rejected`` (kept, never deleted) in one
        transaction; returns a description of where, or None when it was gone."""
        conn = self._db()
        if conn is None:
            return None
        stamp = _stamp()
        try:
            with immediate(conn):  # nothing deleted when it was gone: commits nothing
                gone = conn.execute(
                    "DELETE FROM checkpoints WHERE pipeline = ? AND id = ?",
                    (self.pipeline, cid)).rowcount == 0
                if not gone:
                    cur = conn.execute(
                        "INSERT INTO rejected (pipeline, id, reason, moved_at, name, data) "
                        "SELECT pipeline, id, ?, ?, name, data FROM checkpoint_files "
                        "WHERE pipeline = ? AND id = ?", (reason, stamp, self.pipeline, cid))
                    if cur.rowcount == 0:  # no blob at all: keep a row saying so
                        conn.execute(
                            "INSERT INTO rejected (pipeline, id, reason, moved_at) "
                            "VALUES (?, ?, ?, ?)", (self.pipeline, cid, reason, stamp))
                    conn.execute("DELETE FROM checkpoint_files WHERE pipeline = ? AND id = ?",
                                 (self.pipeline, cid))
            if gone:
                return None
        except sqlite3.Error as exc:
            raise CheckpointError(
                f"cannot move checkpoint {cid} aside in {self.location}: {exc}") from None
        return f"rejected/{checkpoint_dirname(cid)}-{reason}-{stamp}"

    def delete(self, cid: int) -> None:
        conn = self._db()
        if conn is None:
            return
        try:
            self._drop(conn, cid)
        except sqlite3.Error as exc:
            raise CheckpointError(
                f"cannot delete checkpoint {cid} in {self.location}: {exc}") from None

    def clear_trash(self) -> None:
        """Nothing to finish: a deletion is one transaction."""

    # ------------------------------------------------------------ lock
    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Hold this pipeline's run lock; raise LockHeldError naming the holder."""
        self.ensure_root()
        what = f"checkpoints of pipeline {self.pipeline!r} in {self.location}"
        with hold_file_lock(lock_path(self.root, self.pipeline), what):
            yield

    def is_locked(self) -> str | None:
        return file_lock_holder(lock_path(self.root, self.pipeline))
