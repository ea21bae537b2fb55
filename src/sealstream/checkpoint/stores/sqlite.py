"""A checkpoint store in one SQLite database file (stdlib ``sqlite3``, WAL).

Selected by ``[checkpoint] url = "sqlite:///ckpt.db"`` (relative to the spec's
directory; ``sqlite:////abs/ckpt.db`` for an absolute path). Several jobs may
share one database: every row carries the pipeline name and a store only ever
sees its own pipeline's rows.

Tables (prefixed ``sealstream_`` as in PostgreSQL, so that they do not collide
with the user's own tables when the database also holds results)::

    sealstream_checkpoints(pipeline, id, created)   one row per checkpoint id in use
    sealstream_checkpoint_files(pipeline, id, name, data)
                                                    every blob, the manifest included,
                                                    named as in a checkpoint directory
                                                    (``cp-000000000012/state.arrow``)
    sealstream_rejected(seq, pipeline, id, reason, moved_at, name, data)
                                                    checkpoints moved aside: kept, never
                                                    deleted
    sealstream_lock_holders(pipeline, holder)       who holds each job's lock (for
                                                    messages only)

Migration: a database written before the prefix (tables ``checkpoints``,
``checkpoint_files``, ``rejected`` with exactly the columns above) is renamed to the
prefixed names in one transaction when it is first opened; tables of those names
with other columns are the user's and are left alone.

Protocol: the ``sealstream_checkpoints`` row is inserted first (an INSERT that fails
when the id is taken: create-if-absent), then each file in its own committed
transaction, then the manifest row in a last transaction that fails when a manifest
exists: **that commit is the publish**. A crash before it leaves a checkpoint without
a manifest (partial, ``NO_MANIFEST``), exactly like a directory without
``MANIFEST.json``. ``synchronous=FULL`` makes every commit durable. Moving aside and
deleting are one transaction each, so no half-deleted checkpoint exists.

Lock: one writer per job, on the database file's identity. The lock is an open file
description lock (``F_OFD_SETLK``) on one byte of the database file itself, at an
offset derived from the pipeline name far beyond the bytes SQLite locks: the kernel
keys it on the file (device and inode), so a database reached through a symbolic
link, another spelling of its path or a hard link is the same lock, and there is no
sidecar file that could be replaced by a link. The kernel releases it when the
process dies, however it dies. The descriptor it is held on stays open for the rest
of the process, one per database file (POSIX drops every lock a process holds on a
file when it closes any descriptor of it, SQLite's own included). The holder's pid,
host and start time are recorded in ``sealstream_lock_holders`` for messages. Where
the platform has no OFD locks, an ``flock`` on the sidecar
``<resolved db>.lock.<pipeline>-<hash>`` is used instead.

A database file owned by another user or writable by group or others is refused for
a run (CheckpointError saying to chmod it), as a checkpoint directory is; so is a
database file with hard links (SQLite keeps its ``-wal`` per name: a commit made
through one name would be invisible through another after a crash). Its
directory is not checked: it is often a shared project directory, and nothing of
ours is created there (SQLite creates its ``-wal`` and ``-shm`` files beside it).

Encryption at rest works as in the directory store: each blob is an AES-256-GCM
envelope bound to its name.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import re
import socket
import sqlite3
import stat
import struct
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from sealstream._fs import os_reason
from sealstream.checkpoint import crypto
from sealstream.checkpoint._sqlite_tx import immediate as immediate  # re-exported
from sealstream.checkpoint.manifest import MANIFEST_NAME
from sealstream.checkpoint.stores.base import CheckpointStore, checkpoint_dirname
from sealstream.checkpoint.stores.directory import file_lock_holder, hold_file_lock
from sealstream.errors import CheckpointError, LockHeldError

SCHEMA = """
CREATE TABLE IF NOT EXISTS sealstream_checkpoints (
    pipeline TEXT NOT NULL,
    id INTEGER NOT NULL,
    created TEXT NOT NULL,
    PRIMARY KEY (pipeline, id)
);
CREATE TABLE IF NOT EXISTS sealstream_checkpoint_files (
    pipeline TEXT NOT NULL,
    id INTEGER NOT NULL,
    name TEXT NOT NULL,
    data BLOB NOT NULL,
    PRIMARY KEY (pipeline, name)
);
CREATE INDEX IF NOT EXISTS sealstream_checkpoint_files_by_id
    ON sealstream_checkpoint_files (pipeline, id);
CREATE TABLE IF NOT EXISTS sealstream_rejected (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    pipeline TEXT NOT NULL,
    id INTEGER NOT NULL,
    reason TEXT NOT NULL,
    moved_at TEXT NOT NULL,
    name TEXT,
    data BLOB
);
CREATE TABLE IF NOT EXISTS sealstream_lock_holders (
    pipeline TEXT PRIMARY KEY,
    holder TEXT NOT NULL
);
"""

#: the id of step-plan rows (never a checkpoint's: those start at 1)
PLAN_ID = -1
#: the id of shared blobs' rows (emission log segments), outside every checkpoint
SHARED_ID = -2

#: the tables of the layout before the ``sealstream_`` prefix, with their columns
_OLD_TABLES = {
    "checkpoints": ["pipeline", "id", "created"],
    "checkpoint_files": ["pipeline", "id", "name", "data"],
    "rejected": ["seq", "pipeline", "id", "reason", "moved_at", "name", "data"],
}


def _columns(conn: sqlite3.Connection, table: str) -> list[str]:
    return [str(r[1]) for r in conn.execute(f"PRAGMA table_info({table})").fetchall()]


def _tables(conn: sqlite3.Connection) -> set[str]:
    return {str(r[0]) for r in
            conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()}


def migrate(conn: sqlite3.Connection) -> list[str]:
    """Rename the tables of the unprefixed layout to their ``sealstream_`` names, in one
    transaction, when the prefixed ones do not exist yet; returns the tables renamed.
    Only tables with exactly the old columns are ours: any other is left alone."""
    if not _OLD_TABLES.keys() & _tables(conn):
        return []
    with immediate(conn):
        present = _tables(conn)
        moved = [t for t, cols in _OLD_TABLES.items()
                 if t in present and f"sealstream_{t}" not in present
                 and _columns(conn, t) == cols]
        if "checkpoint_files" not in moved:
            return []  # not our layout (a user's table that shares a name)
        for t in moved:
            conn.execute(f"ALTER TABLE {t} RENAME TO sealstream_{t}")
        conn.execute("DROP INDEX IF EXISTS checkpoint_files_by_id")
    return moved


def _stamp() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def lock_path(db: Path, pipeline: str) -> Path:
    """The sidecar lock file of ``pipeline`` in database ``db`` where the platform has
    no OFD locks: next to the file the path resolves to."""
    real = db.resolve()
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", pipeline)[:64]
    tag = hashlib.sha256(pipeline.encode()).hexdigest()[:8]
    return real.with_name(f"{real.name}.lock.{safe}-{tag}")


_OFD = hasattr(fcntl, "F_OFD_SETLK")
#: lock bytes start far past anything SQLite locks (its lock bytes sit at 1 GiB)
_LOCK_BASE = 1 << 62
_FLOCK = "hhqqi4x"  # struct flock: l_type, l_whence, l_start, l_len, l_pid (+ padding)
#: (st_dev, st_ino) -> a descriptor of that database file, kept open (see the module doc)
_FDS: dict[tuple[int, int], int] = {}
#: (st_dev, st_ino, pipeline) -> holder, for the locks this process holds
_HELD: dict[tuple[int, int, str], str] = {}
_GUARD = threading.Lock()


def _lock_offset(pipeline: str) -> int:
    return _LOCK_BASE + int(hashlib.sha256(pipeline.encode()).hexdigest()[:10], 16)


def _identity_fd(db: Path) -> tuple[tuple[int, int], int]:
    """The (device, inode) of database ``db`` and the descriptor kept for it."""
    st = os.stat(db)
    ident = (st.st_dev, st.st_ino)
    with _GUARD:
        fd = _FDS.get(ident)
        if fd is None:
            try:
                fd = os.open(db, os.O_RDWR | getattr(os, "O_CLOEXEC", 0))
            except PermissionError:
                fd = os.open(db, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
            if (os.fstat(fd).st_dev, os.fstat(fd).st_ino) != ident:  # replaced meanwhile
                os.close(fd)
                raise OSError(errno.EAGAIN, "the database file was replaced while opened")
            _FDS[ident] = fd
    return ident, fd


def _ofd(fd: int, cmd: int, kind: int, offset: int) -> int:
    """One fcntl OFD lock call on byte ``offset``; returns the l_type reported."""
    arg = struct.pack(_FLOCK, kind, os.SEEK_SET, offset, 1, 0)
    res = fcntl.fcntl(fd, cmd, arg)
    return int(struct.unpack(_FLOCK, res)[0])


def pipelines_in(db: Path) -> list[str]:
    """The pipeline names with checkpoints (present or rejected) in ``db``."""
    if not db.is_file():
        return []
    try:
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        try:
            prefix = "sealstream_" if "sealstream_checkpoints" in _tables(conn) else ""
            if f"{prefix}checkpoints" not in _tables(conn):
                return []
            rows = conn.execute(
                f"SELECT pipeline FROM {prefix}checkpoints "
                f"UNION SELECT pipeline FROM {prefix}rejected").fetchall()
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
                migrate(conn)
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

    # only integer ids: a row whose id is text ('abc', which the INTEGER column keeps
    # as TEXT) was written by no sealstream and is no checkpoint
    def ids(self) -> list[int]:
        return [int(r[0]) for r in
                self._query("SELECT id FROM sealstream_checkpoints WHERE pipeline = ? "
                            "AND typeof(id) = 'integer' ORDER BY id")]

    def max_id_ever(self) -> int:
        rows = self._query(
            "SELECT MAX(id) FROM (SELECT id FROM sealstream_checkpoints WHERE pipeline = ?1 "
            "UNION ALL SELECT id FROM sealstream_rejected WHERE pipeline = ?1) "
            "WHERE typeof(id) = 'integer'"
        )
        return int(rows[0][0]) if rows and rows[0][0] is not None else 0

    def _raw(self, rel: str) -> bytes | None:
        # CAST: SQLite lets any column hold any type, so a row damaged behind the store's
        # back (UPDATE ... SET data = 'text') may hold TEXT, a number or NULL; judge the
        # bytes the database holds, whatever their type, as those of a damaged file
        rows = self._query(
            "SELECT CAST(data AS BLOB) FROM sealstream_checkpoint_files "
            "WHERE pipeline = ? AND name = ?", rel)
        if not rows:
            return None
        return bytes(rows[0][0]) if rows[0][0] is not None else b""

    def _names(self, cid: int) -> list[str]:
        return [str(r[0]) for r in self._query(
            "SELECT name FROM sealstream_checkpoint_files WHERE pipeline = ? AND id = ? "
            "ORDER BY name", cid)]

    def rejected(self) -> list[dict[str, Any]]:
        """The checkpoints moved aside (evidence), oldest move first."""
        rows = self._query(
            "SELECT id, reason, moved_at, COUNT(name) FROM sealstream_rejected WHERE pipeline = ? "
            "AND typeof(id) = 'integer' GROUP BY id, reason, moved_at ORDER BY MIN(seq)")
        return [{"id": int(r[0]), "reason": r[1], "moved_at": r[2], "files": int(r[3])}
                for r in rows]

    # ------------------------------------------------------------ writing
    def ensure_root(self) -> None:
        self._db(create=True)

    transactional = True

    #: no :meth:`write_part`: the lock is a kernel lock of the coordinator's process on
    #: a database file (one host: no worker on another node can reach it safely, and
    #: SQLite over a network file system is unsafe), so parts go through the coordinator
    direct_parts = False

    def write_checkpoint(self, cid: int, files: dict[str, bytes], manifest: bytes,
                         crash: Any = None,
                         in_publish: Callable[[Any], None] | None = None,
                         claimed: bool = False) -> None:
        if claimed:
            raise TypeError("an SQLite store has no direct parts: nothing claims ids")
        conn = self._db(create=True)
        assert conn is not None
        d = checkpoint_dirname(cid)
        mrel = f"{d}/{MANIFEST_NAME}"
        claimed = False
        try:
            conn.execute("INSERT INTO sealstream_checkpoints (pipeline, id, created) "
                         "VALUES (?, ?, ?)", (self.pipeline, cid, _stamp()))
            claimed = True
            for name, data in files.items():
                rel = f"{d}/{name}"
                conn.execute(
                    "INSERT INTO sealstream_checkpoint_files (pipeline, id, name, data) "
                    "VALUES (?, ?, ?, ?)",
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
                    "INSERT INTO sealstream_checkpoint_files (pipeline, id, name, data) "
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
            conn.execute("DELETE FROM sealstream_checkpoint_files WHERE pipeline = ? AND id = ?",
                         (self.pipeline, cid))
            conn.execute("DELETE FROM sealstream_checkpoints WHERE pipeline = ? AND id = ?",
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
                    "DELETE FROM sealstream_checkpoints WHERE pipeline = ? AND id = ?",
                    (self.pipeline, cid)).rowcount == 0
                if not gone:
                    cur = conn.execute(
                        "INSERT INTO sealstream_rejected "
                        "(pipeline, id, reason, moved_at, name, data) "
                        "SELECT pipeline, id, ?, ?, name, data FROM sealstream_checkpoint_files "
                        "WHERE pipeline = ? AND id = ?", (reason, stamp, self.pipeline, cid))
                    if cur.rowcount == 0:  # no blob at all: keep a row saying so
                        conn.execute(
                            "INSERT INTO sealstream_rejected (pipeline, id, reason, moved_at) "
                            "VALUES (?, ?, ?, ?)", (self.pipeline, cid, reason, stamp))
                    conn.execute("DELETE FROM sealstream_checkpoint_files "
                                 "WHERE pipeline = ? AND id = ?", (self.pipeline, cid))
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

    # ------------------------------------------------------------ step plans
    # rows of sealstream_checkpoint_files with id PLAN_ID, named plans/step-N.json
    def write_shared(self, rel: str, data: bytes) -> None:
        conn = self._db(create=True)
        assert conn is not None
        try:
            with immediate(conn):
                conn.execute(
                    "INSERT OR IGNORE INTO sealstream_checkpoint_files (pipeline, id, name, "
                    "data) VALUES (?, ?, ?, ?)", (self.pipeline, SHARED_ID, rel,
                                                  self._seal(rel, data)))
        except sqlite3.Error as exc:
            raise CheckpointError(f"cannot write {rel} in {self.location}: {exc}") from None

    def write_plan(self, step: int, data: bytes) -> None:
        from sealstream.checkpoint.plans import plan_name

        conn = self._db(create=True)
        assert conn is not None
        rel = plan_name(step)
        try:
            with immediate(conn):
                conn.execute(
                    "INSERT INTO sealstream_checkpoint_files (pipeline, id, name, data) "
                    "VALUES (?, ?, ?, ?)", (self.pipeline, PLAN_ID, rel, self._seal(rel, data)))
        except sqlite3.Error as exc:
            raise CheckpointError(
                f"cannot write the plan of step {step} in {self.location}: {exc}") from None

    def plan_steps(self) -> list[int]:
        from sealstream.checkpoint.plans import parse_plan_name

        rows = self._query("SELECT name FROM sealstream_checkpoint_files WHERE pipeline = ? "
                           "AND id = ?", PLAN_ID)
        steps = [parse_plan_name(str(r[0])) for r in rows]
        return sorted(s for s in steps if s is not None)

    def delete_plans(self, steps: list[int]) -> None:
        from sealstream.checkpoint.plans import plan_name

        conn = self._db()
        if conn is None or not steps:
            return
        try:
            with immediate(conn):
                conn.executemany(
                    "DELETE FROM sealstream_checkpoint_files WHERE pipeline = ? AND id = ? "
                    "AND name = ?", [(self.pipeline, PLAN_ID, plan_name(s)) for s in steps])
        except sqlite3.Error as exc:
            raise CheckpointError(
                f"cannot delete step plans in {self.location}: {exc}") from None

    def move_plan_aside(self, step: int, reason: str) -> None:
        from sealstream.checkpoint.plans import plan_name

        conn = self._db()
        if conn is None:
            return
        rel = plan_name(step)
        try:
            with immediate(conn):
                conn.execute(
                    "INSERT INTO sealstream_rejected (pipeline, id, reason, moved_at, name, data) "
                    "SELECT pipeline, id, ?, ?, name, data FROM sealstream_checkpoint_files "
                    "WHERE pipeline = ? AND id = ? AND name = ?",
                    (reason, _stamp(), self.pipeline, PLAN_ID, rel))
                conn.execute("DELETE FROM sealstream_checkpoint_files WHERE pipeline = ? "
                             "AND id = ? AND name = ?", (self.pipeline, PLAN_ID, rel))
        except sqlite3.Error as exc:
            raise CheckpointError(
                f"cannot move the plan of step {step} aside in {self.location}: {exc}"
            ) from None


    # ------------------------------------------------------------ lock
    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Hold this pipeline's run lock on the database file's identity; raise
        LockHeldError naming the holder, CheckpointError when the database file is
        not private to this user."""
        what = f"checkpoints of pipeline {self.pipeline!r} in {self.location}"
        if os.path.lexists(self.root):
            self._check_private()  # before SQLite opens it (and its -wal) at all
        self.ensure_root()
        self._check_private()
        if not _OFD:  # pragma: no cover - platforms without OFD locks
            with hold_file_lock(lock_path(self.root, self.pipeline), what):
                yield
            return
        try:
            ident, fd = _identity_fd(self.root)
        except OSError as exc:
            raise CheckpointError(f"cannot lock {what}: {os_reason(exc)}") from None
        key = (*ident, self.pipeline)
        offset = _lock_offset(self.pipeline)
        holder = json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                             "started": _stamp()})
        with _GUARD:
            mine = _HELD.get(key)
            if mine is None:
                try:
                    _ofd(fd, fcntl.F_OFD_SETLK, fcntl.F_WRLCK, offset)
                except BlockingIOError:
                    mine = self._holder() or "unknown"
                except OSError as exc:
                    if exc.errno not in (errno.EAGAIN, errno.EACCES):
                        raise CheckpointError(f"cannot lock {what}: {os_reason(exc)}") from None
                    mine = self._holder() or "unknown"
                else:
                    _HELD[key] = holder
        if mine is not None:
            raise LockHeldError(f"{what} is locked by another run ({mine})")
        try:
            self._set_holder(holder)
            yield
        finally:
            with contextlib.suppress(CheckpointError):
                self._set_holder(None)
            with _GUARD:
                _HELD.pop(key, None)
                _ofd(fd, fcntl.F_OFD_SETLK, fcntl.F_UNLCK, offset)

    def is_locked(self) -> str | None:
        if not _OFD:  # pragma: no cover - platforms without OFD locks
            return file_lock_holder(lock_path(self.root, self.pipeline))
        if not self.root.is_file():
            return None
        try:
            ident, fd = _identity_fd(self.root)
        except OSError:
            return None
        with _GUARD:
            mine = _HELD.get((*ident, self.pipeline))
        if mine is not None:
            return mine
        kind = _ofd(fd, fcntl.F_OFD_GETLK, fcntl.F_WRLCK, _lock_offset(self.pipeline))
        if kind == fcntl.F_UNLCK:
            return None
        return self._holder() or "unknown"

    def _check_private(self) -> None:
        try:
            st = os.stat(self.root)
        except OSError as exc:
            raise CheckpointError(f"cannot open checkpoint database {self.root}: "
                                  f"{os_reason(exc)}") from None
        if not stat.S_ISREG(st.st_mode):
            raise CheckpointError(f"checkpoint database {self.root} is not a regular file")
        if st.st_nlink > 1:
            raise CheckpointError(
                f"refusing checkpoint database {self.root}: it has {st.st_nlink} names (hard "
                "links), and SQLite keeps its write-ahead log per name, so a commit made "
                "through one name is lost to the others; remove the other links")
        if st.st_uid != os.geteuid():
            raise CheckpointError(
                f"refusing checkpoint database {self.root}: it is owned by another user "
                f"(uid {st.st_uid}, not {os.geteuid()}); use a database of your own")
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise CheckpointError(
                f"refusing checkpoint database {self.root}: it is writable by group or "
                f"others (mode {stat.S_IMODE(st.st_mode):04o}); run chmod go-w on it")

    def _holder(self) -> str | None:
        """The recorded holder, or None (also when the database cannot be read now)."""
        try:
            rows = self._query("SELECT holder FROM sealstream_lock_holders WHERE pipeline = ?")
        except CheckpointError:
            return None
        return str(rows[0][0]) if rows else None

    def _set_holder(self, holder: str | None) -> None:
        conn = self._db(create=True)
        assert conn is not None
        try:
            with immediate(conn):
                conn.execute("DELETE FROM sealstream_lock_holders WHERE pipeline = ?",
                             (self.pipeline,))
                if holder is not None:
                    conn.execute("INSERT INTO sealstream_lock_holders (pipeline, holder) "
                                 "VALUES (?, ?)", (self.pipeline, holder))
        except sqlite3.Error as exc:
            raise CheckpointError(
                f"cannot record the lock holder in {self.location}: {exc}") from None
