"""A checkpoint store in a PostgreSQL database (psycopg 3).

Selected by ``[checkpoint] url = "postgresql://user@host/db"`` (``postgres://``
too; the password is best given by ``PGPASSWORD`` or ``~/.pgpass``, and is never
shown: :func:`sealstream.checkpoint.stores.redact`). Several jobs may share one
database: every row carries the pipeline name, and a store only ever sees its
own pipeline's rows.

Tables (created if absent, in the connection's default schema)::

    sealstream_checkpoints(pipeline, id, created)          one row per checkpoint id
    sealstream_checkpoint_files(pipeline, id, name, data)  every blob, manifest included,
                                                           named as in a directory
    sealstream_rejected(seq, pipeline, id, reason, moved_at, name, data)
                                                           checkpoints moved aside

The protocol is the SQLite store's: the ``sealstream_checkpoints`` row is inserted
first (create-if-absent), then each file in its own committed transaction, then
the manifest row in a last transaction that fails when a manifest exists:
**that commit is the publish**. A crash before it leaves a checkpoint without a
manifest (``NO_MANIFEST``). Work that must become visible exactly when the
checkpoint does (a transactional sink's rows in the same database) runs inside
that last transaction (``in_publish``).

Lock: one writer per job is a session-level advisory lock
(``pg_try_advisory_lock``) on a 64-bit key derived from the pipeline name, held
by a dedicated connection for the run's lifetime. The server releases it when
that connection ends, however the process dies. The holder (pid, host, start
time) is recorded in ``sealstream_lock_holders``, which is only believed while
the advisory lock is actually held.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import socket
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any

from sealstream.checkpoint import crypto
from sealstream.checkpoint.manifest import MANIFEST_NAME
from sealstream.checkpoint.store import CheckpointStore, checkpoint_dirname
from sealstream.errors import CheckpointError, LockHeldError

SCHEMA = """
CREATE TABLE IF NOT EXISTS sealstream_checkpoints (
    pipeline TEXT NOT NULL,
    id BIGINT NOT NULL,
    created TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (pipeline, id)
);
CREATE TABLE IF NOT EXISTS sealstream_checkpoint_files (
    pipeline TEXT NOT NULL,
    id BIGINT NOT NULL,
    name TEXT NOT NULL,
    data BYTEA NOT NULL,
    PRIMARY KEY (pipeline, name)
);
CREATE INDEX IF NOT EXISTS sealstream_checkpoint_files_by_id
    ON sealstream_checkpoint_files (pipeline, id);
CREATE TABLE IF NOT EXISTS sealstream_rejected (
    seq BIGSERIAL PRIMARY KEY,
    pipeline TEXT NOT NULL,
    id BIGINT NOT NULL,
    reason TEXT NOT NULL,
    moved_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    name TEXT,
    data BYTEA
);
CREATE TABLE IF NOT EXISTS sealstream_lock_holders (
    pipeline TEXT PRIMARY KEY,
    holder TEXT NOT NULL
);
"""

#: the first half of every advisory lock key of ours ("sealstream" in a few bits)
_LOCK_SPACE = b"sealstream checkpoint lock:"


def lock_key(pipeline: str) -> int:
    """The signed 64-bit advisory lock key of ``pipeline``."""
    digest = hashlib.sha256(_LOCK_SPACE + pipeline.encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def _psycopg() -> Any:
    try:
        import psycopg
    except ImportError:  # pragma: no cover - depends on the installation
        raise CheckpointError(
            "PostgreSQL checkpoint stores need psycopg 3: pip install 'sealstream[postgres]'"
        ) from None
    return psycopg


def connect(url: str, what: str, **kwargs: Any) -> Any:
    """An autocommit psycopg connection to ``url``; CheckpointError naming ``what``
    (a redacted location) when it cannot connect."""
    psycopg = _psycopg()
    try:
        return psycopg.connect(url, autocommit=True, connect_timeout=10, **kwargs)
    except psycopg.Error as exc:
        raise CheckpointError(f"cannot connect to {what}: {_reason(exc)}") from None


def _reason(exc: BaseException) -> str:
    """The first line of a database error (psycopg puts details on later lines)."""
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def pipelines_in(url: str, what: str) -> list[str]:
    """The pipeline names with checkpoints (present or rejected) in the database."""
    conn = connect(url, what)
    try:
        exists = conn.execute("SELECT to_regclass('sealstream_checkpoints') IS NOT NULL, "
                              "to_regclass('sealstream_rejected') IS NOT NULL").fetchone()
        if not exists[0] or not exists[1]:
            return []
        rows = conn.execute("SELECT pipeline FROM sealstream_checkpoints UNION "
                            "SELECT pipeline FROM sealstream_rejected").fetchall()
    except _psycopg().Error as exc:
        raise CheckpointError(f"cannot read checkpoints in {what}: {_reason(exc)}") from None
    finally:
        conn.close()
    return sorted(str(r[0]) for r in rows)


class PostgresCheckpointStore(CheckpointStore):
    """The checkpoints of pipeline ``pipeline`` in the PostgreSQL database at ``url``."""

    def __init__(self, url: str, pipeline: str, *, shown: str | None = None,
                 encryption_key: bytes | None | object = crypto.FROM_ENV) -> None:
        from pathlib import Path

        from sealstream.checkpoint.stores import redact

        self.url = url
        self.pipeline = pipeline
        self._shown = shown or redact(url)
        self.root = Path(self._shown)  # only ever used in messages
        self._conn: Any = None
        self._ready = False
        self._init_key(encryption_key)

    @property
    def location(self) -> str:
        return self._shown

    # ------------------------------------------------------------ connection
    def _db(self) -> Any:
        if self._conn is None or self._conn.closed:
            self._conn = connect(self.url, self._shown)
            # closed when the store is collected or at exit, if close() was not called
            weakref.finalize(self, self._conn.close)
        return self._conn

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _tables_exist(self) -> bool:
        if self._ready:
            return True
        row = self._db().execute(
            "SELECT to_regclass('sealstream_checkpoint_files') IS NOT NULL").fetchone()
        self._ready = bool(row[0])
        return self._ready

    def _query(self, sql: str, *args: Any) -> list[tuple[Any, ...]]:
        psycopg = _psycopg()
        try:
            if not self._tables_exist():
                return []
            return list(self._db().execute(sql, (self.pipeline, *args)).fetchall())
        except psycopg.Error as exc:
            raise CheckpointError(
                f"cannot read checkpoints in {self._shown}: {_reason(exc)}") from None

    # ------------------------------------------------------------ reading
    def exists(self) -> bool:
        try:
            return self._tables_exist()
        except _psycopg().Error as exc:
            raise CheckpointError(
                f"cannot read checkpoints in {self._shown}: {_reason(exc)}") from None

    def ids(self) -> list[int]:
        return [int(r[0]) for r in self._query(
            "SELECT id FROM sealstream_checkpoints WHERE pipeline = %s ORDER BY id")]

    def max_id_ever(self) -> int:
        rows = self._query(
            "SELECT MAX(id) FROM (SELECT id FROM sealstream_checkpoints WHERE pipeline = %s "
            "UNION ALL SELECT id FROM sealstream_rejected WHERE pipeline = %s) AS t",
            self.pipeline)
        return int(rows[0][0]) if rows and rows[0][0] is not None else 0

    def _raw(self, rel: str) -> bytes | None:
        rows = self._query(
            "SELECT data FROM sealstream_checkpoint_files WHERE pipeline = %s AND name = %s",
            rel)
        return bytes(rows[0][0]) if rows else None

    def _names(self, cid: int) -> list[str]:
        return [str(r[0]) for r in self._query(
            "SELECT name FROM sealstream_checkpoint_files WHERE pipeline = %s AND id = %s "
            "ORDER BY name", cid)]

    def rejected(self) -> list[dict[str, Any]]:
        """The checkpoints moved aside (evidence), oldest move first."""
        rows = self._query(
            "SELECT id, reason, to_char(moved_at AT TIME ZONE 'UTC', "
            "'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"'), COUNT(name) FROM sealstream_rejected "
            "WHERE pipeline = %s GROUP BY id, reason, moved_at ORDER BY MIN(seq)")
        return [{"id": int(r[0]), "reason": r[1], "moved_at": r[2], "files": int(r[3])}
                for r in rows]

    # ------------------------------------------------------------ writing
    def ensure_root(self) -> None:
        psycopg = _psycopg()
        if self._ready:
            return
        try:
            conn = self._db()
            with conn.transaction():
                # concurrent first runs must not race on CREATE TABLE IF NOT EXISTS
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (lock_key(""),))
                conn.execute(SCHEMA)
        except psycopg.Error as exc:
            raise CheckpointError(
                f"cannot create the checkpoint tables in {self._shown}: {_reason(exc)}"
            ) from None
        self._ready = True

    transactional = True

    def write_checkpoint(self, cid: int, files: dict[str, bytes], manifest: bytes,
                         crash: Any = None,
                         in_publish: Callable[[Any], None] | None = None) -> None:
        """See :meth:`CheckpointStore.write_checkpoint`. ``in_publish(conn)`` runs in
        the transaction that publishes the manifest (a sink's rows in this database
        commit exactly with the checkpoint)."""
        psycopg = _psycopg()
        self.ensure_root()
        conn = self._db()
        d = checkpoint_dirname(cid)
        mrel = f"{d}/{MANIFEST_NAME}"
        claimed = False
        try:
            conn.execute("INSERT INTO sealstream_checkpoints (pipeline, id) VALUES (%s, %s)",
                         (self.pipeline, cid))
            claimed = True
            for name, data in files.items():
                rel = f"{d}/{name}"
                conn.execute(
                    "INSERT INTO sealstream_checkpoint_files (pipeline, id, name, data) "
                    "VALUES (%s, %s, %s, %s)", (self.pipeline, cid, rel, self._seal(rel, data)))
                if crash is not None:
                    crash(f"after_write_{name.split('.')[0]}")
            sealed = self._seal(mrel, manifest)
            if crash is not None:
                crash("before_manifest_publish")
            with conn.transaction():  # the publish
                if in_publish is not None:
                    in_publish(conn)
                conn.execute(
                    "INSERT INTO sealstream_checkpoint_files (pipeline, id, name, data) "
                    "VALUES (%s, %s, %s, %s)", (self.pipeline, cid, mrel, sealed))
        except psycopg.Error as exc:
            if claimed:
                with contextlib.suppress(psycopg.Error):
                    if conn.info.transaction_status == 0 and self._raw(mrel) is None:
                        self._drop(conn, cid)
            what = ("already exists" if isinstance(exc, psycopg.errors.UniqueViolation)
                    else _reason(exc))
            raise CheckpointError(
                f"cannot write checkpoint {cid} in {self._shown}: {what}; "
                "the previous checkpoints are intact"
            ) from None

    def _drop(self, conn: Any, cid: int) -> None:
        with conn.transaction():
            conn.execute("DELETE FROM sealstream_checkpoint_files WHERE pipeline = %s "
                         "AND id = %s", (self.pipeline, cid))
            conn.execute("DELETE FROM sealstream_checkpoints WHERE pipeline = %s AND id = %s",
                         (self.pipeline, cid))

    def move_aside(self, cid: int, reason: str) -> str | None:
        """Move checkpoint ``cid``'s rows to ``sealstream_rejected`` (kept, never
        deleted) in one transaction; returns where, or None when it was gone."""
        psycopg = _psycopg()
        if not self.exists():
            return None
        conn = self._db()
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
        try:
            with conn.transaction():
                gone = conn.execute(
                    "DELETE FROM sealstream_checkpoints WHERE pipeline = %s AND id = %s",
                    (self.pipeline, cid)).rowcount == 0
                if gone:
                    return None
                cur = conn.execute(
                    "INSERT INTO sealstream_rejected (pipeline, id, reason, name, data) "
                    "SELECT pipeline, id, %s, name, data FROM sealstream_checkpoint_files "
                    "WHERE pipeline = %s AND id = %s ORDER BY name",
                    (reason, self.pipeline, cid))
                if cur.rowcount == 0:  # no blob at all: keep a row saying so
                    conn.execute("INSERT INTO sealstream_rejected (pipeline, id, reason) "
                                 "VALUES (%s, %s, %s)", (self.pipeline, cid, reason))
                conn.execute("DELETE FROM sealstream_checkpoint_files WHERE pipeline = %s "
                             "AND id = %s", (self.pipeline, cid))
        except psycopg.Error as exc:
            raise CheckpointError(
                f"cannot move checkpoint {cid} aside in {self._shown}: {_reason(exc)}"
            ) from None
        return f"rejected/{checkpoint_dirname(cid)}-{reason}-{stamp}"

    def delete(self, cid: int) -> None:
        psycopg = _psycopg()
        if not self.exists():
            return
        try:
            self._drop(self._db(), cid)
        except psycopg.Error as exc:
            raise CheckpointError(
                f"cannot delete checkpoint {cid} in {self._shown}: {_reason(exc)}") from None

    def clear_trash(self) -> None:
        """Nothing to finish: a deletion is one transaction."""

    # ------------------------------------------------------------ lock
    def _holder_name(self) -> str:
        return f"sealstream pid={os.getpid()} host={socket.gethostname()}"[:63]

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Hold this pipeline's advisory lock for the run; LockHeldError names the holder."""
        psycopg = _psycopg()
        self.ensure_root()
        conn = connect(self.url, self._shown, application_name=self._holder_name())
        try:
            try:
                got = conn.execute("SELECT pg_try_advisory_lock(%s)",
                                   (lock_key(self.pipeline),)).fetchone()[0]
            except psycopg.Error as exc:
                raise CheckpointError(
                    f"cannot lock the checkpoints of pipeline {self.pipeline!r} in "
                    f"{self._shown}: {_reason(exc)}") from None
            if not got:
                holder = self.is_locked() or "unknown"
                raise LockHeldError(
                    f"checkpoints of pipeline {self.pipeline!r} in {self._shown} are locked "
                    f"by another run ({holder})")
            info = json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                               "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
            conn.execute("INSERT INTO sealstream_lock_holders (pipeline, holder) "
                         "VALUES (%s, %s) ON CONFLICT (pipeline) DO UPDATE "
                         "SET holder = EXCLUDED.holder", (self.pipeline, info))
            yield
        finally:
            conn.close()  # ends the session: the server releases the lock

    def is_locked(self) -> str | None:
        key = lock_key(self.pipeline)
        classid, objid = (key >> 32) & 0xFFFFFFFF, key & 0xFFFFFFFF
        conn = connect(self.url, self._shown)
        try:
            if not conn.execute(
                    "SELECT to_regclass('sealstream_lock_holders') IS NOT NULL").fetchone()[0]:
                return None  # no run ever took a lock here
            row = conn.execute(
                "SELECT (SELECT holder FROM sealstream_lock_holders WHERE pipeline = %s), "
                "a.application_name, a.client_addr::text "
                "FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid "
                "WHERE l.locktype = 'advisory' AND l.granted AND l.classid::bigint = %s "
                "AND l.objid::bigint = %s AND l.objsubid = 1 "
                "AND l.database = (SELECT oid FROM pg_database "
                "WHERE datname = current_database())",
                (self.pipeline, classid, objid)).fetchone()
        except _psycopg().Error as exc:
            raise CheckpointError(
                f"cannot read the locks of {self._shown}: {_reason(exc)}") from None
        finally:
            conn.close()
        if row is None:
            return None
        holder, name, addr = row
        if holder:
            return str(holder)
        return f"{name or 'a PostgreSQL session'}" + (f" from {addr}" if addr else "")
