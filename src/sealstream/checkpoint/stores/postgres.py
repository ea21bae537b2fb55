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
that connection ends, however the process dies; a run that ends releases it
itself (``pg_advisory_unlock``) before it returns, so a restart right after is
never refused. The holder (pid, host, start time) is recorded in
``sealstream_lock_holders``, which is only believed while the advisory lock is
actually held.

Fencing: the lock's session can end while the job runs (``pg_terminate_backend``,
``idle_session_timeout``, a server restart, a network cut), and another run may
then take the lock. So taking the lock also bumps the pipeline's ``generation``
in ``sealstream_lock_holders`` (in the lock's own session) and records that
session's backend pid; every commit of a locked store (claiming a checkpoint id,
each file, the publish, moving aside, deleting) first locks that row (``SELECT ... FOR
UPDATE``) in the same transaction and checks that the generation is still its
own and that its lock session still holds the advisory lock. Otherwise it raises
:class:`~sealstream.errors.LockHeldError` ("the lock ... was lost") and commits
nothing. A run that takes the lock bumps the generation only once the other
run's commit in flight is over (the row lock), so no epoch is committed twice.

Connection faults: connecting, and a connection lost under an idempotent read or
write, are retried with exponential back-off for :func:`retry_seconds` (default
:data:`RETRY_S`, ``SEALSTREAM_PG_RETRY_S`` overrides) before failing with the
server named (password hidden). A publish whose connection was lost is not
repeated blindly: the manifest row is read back first (it is there: the commit
went through). The driver's own log lines (``psycopg`` logger) are never printed.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import socket
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any, Protocol, TypeVar

from sealstream._env import seconds
from sealstream.checkpoint import crypto
from sealstream.checkpoint.manifest import MANIFEST_NAME
from sealstream.checkpoint.stores._urls import redact
from sealstream.checkpoint.stores.base import _PART_FILE, CheckpointStore, checkpoint_dirname
from sealstream.errors import CheckpointError, LockHeldError, SpecError

T = TypeVar("T")

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
    holder TEXT NOT NULL,
    generation BIGINT NOT NULL DEFAULT 0,
    backend_pid INTEGER
);
"""
#: the id of step-plan rows (never a checkpoint's: those start at 1)
PLAN_ID = -1
#: the id of shared blobs' rows (emission log segments), outside every checkpoint
SHARED_ID = -2
#: columns added to ``sealstream_lock_holders`` since its first version
_LOCK_COLUMNS = {"generation": "BIGINT NOT NULL DEFAULT 0", "backend_pid": "INTEGER"}

#: seconds transient connection errors are retried by default
RETRY_S = 30.0
#: the environment variable that sets it (seconds, >= 0; 0: no retry)
RETRY_ENV = "SEALSTREAM_PG_RETRY_S"
#: the longest pause between two attempts
_MAX_DELAY_S = 2.0
#: connect-time failures that are the server's answer, not a fault of the moment
_PERMANENT = ("password authentication failed", "does not exist", "no pg_hba.conf entry",
              "is not permitted to log in", "could not translate host name",
              "invalid")
#: connect-time answers that are transient even so
_TRANSIENT = ("the database system is starting up", "the database system is shutting down",
              "the database system is in recovery mode", "too many clients",
              "connection slots are reserved", "terminating connection")

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
    quiet_driver()
    return psycopg


_quiet = False


def quiet_driver() -> None:
    """Keep the driver's log lines (``error ignored terminating Copy...``, printed by
    Python's last-resort handler when nothing is configured) off the terminal; the
    error itself is reported as one line. An application that configures logging
    still gets them through its own handlers."""
    global _quiet
    if not _quiet:
        logging.getLogger("psycopg").addHandler(logging.NullHandler())
        _quiet = True


def retry_seconds() -> float:
    """How long transient connection errors are retried: ``SEALSTREAM_PG_RETRY_S``
    (seconds, >= 0) or :data:`RETRY_S`."""
    return seconds(RETRY_ENV, RETRY_S)


def transient(exc: BaseException, conn: Any = None) -> bool:
    """Whether ``exc`` is a fault of the moment (a connection refused, cut or
    ended by the server) rather than the server's answer (a wrong password, a
    missing database, an SQL error). ``conn``: the connection it came from."""
    psycopg = _psycopg()
    if not isinstance(exc, psycopg.OperationalError):
        return False
    if conn is not None and (conn.broken or conn.closed):
        return True
    state = getattr(exc, "sqlstate", None)
    if state is not None:
        return bool(state.startswith("08") or state in ("57P01", "57P02", "57P03"))
    text = str(exc)
    if any(t in text for t in _TRANSIENT):
        return True
    return not any(p in text for p in _PERMANENT)


def notice(text: str) -> None:
    """One line on stderr while a fault is retried (the run's progress shows it: the
    live panel keeps stderr lines above it, the JSON log has them between its lines)."""
    import sys

    print(f"sealstream: {text}", file=sys.stderr, flush=True)


def retrying_notice(where: str, exc: BaseException) -> str:
    s = retry_seconds()
    return (f"lost the connection to {where} ({_reason(exc)}); reconnecting with back-off "
            f"for up to {s:g} s")


def _pause(delay: float, deadline: float) -> float | None:
    """Sleep before the next attempt; the next delay, or None when the time is up."""
    left = deadline - time.monotonic()
    if left <= 0:
        return None
    time.sleep(min(delay, left))
    return min(delay * 2, _MAX_DELAY_S)


def connect_raw(url: str, deadline: float | None = None, *, what: str | None = None,
                **kwargs: Any) -> Any:
    """An autocommit psycopg connection to ``url``, transient failures retried until
    ``deadline`` (a ``time.monotonic()`` instant; default: :func:`retry_seconds`
    from now), with a :func:`notice` naming ``what`` when the first attempt fails.
    Raises the driver's last error."""
    psycopg = _psycopg()
    if deadline is None:
        deadline = time.monotonic() + retry_seconds()
    delay: float | None = 0.1
    first = True
    while True:
        try:
            return psycopg.connect(url, autocommit=True, connect_timeout=10, **kwargs)
        except psycopg.Error as exc:
            if not transient(exc):
                raise
            if first and what is not None and deadline > time.monotonic():
                notice(f"cannot reach {what} ({_reason(exc)}); retrying with back-off "
                       f"for up to {retry_seconds():g} s")
            first = False
            delay = _pause(delay, deadline) if delay is not None else None
            if delay is None:
                raise


def retried_for() -> str:
    """How a message says that the fault was retried."""
    s = retry_seconds()
    return f" (retried for {s:g} s)" if s > 0 else ""


def connect(url: str, what: str, deadline: float | None = None, **kwargs: Any) -> Any:
    """An autocommit psycopg connection to ``url`` (see :func:`connect_raw`);
    CheckpointError naming ``what`` (a redacted location) when it cannot connect."""
    psycopg = _psycopg()
    try:
        return connect_raw(url, deadline, what=what, **kwargs)
    except psycopg.Error as exc:
        more = retried_for() if transient(exc) else ""
        raise CheckpointError(f"cannot connect to {what}: {_reason(exc)}{more}") from None


class Reconnectable(Protocol):
    """An owner of one psycopg connection: ``_db()`` opens it when ``_conn`` is None."""

    _conn: Any

    def _db(self) -> Any: ...


def reconnecting(owner: Reconnectable, fn: Callable[[Any, int], T], shown: str) -> T:
    """``fn(connection, attempt)``, again on a new connection of ``owner`` while the
    connection is lost (a transient fault), for :func:`retry_seconds` at most, with a
    :func:`notice` when the fault starts and when it is over. ``fn`` must be safe to
    repeat after a lost outcome (``attempt`` > 0 says it is a repeat); the last error
    is raised when the time is up or the fault is not transient."""
    psycopg = _psycopg()
    started = time.monotonic()
    deadline = started + retry_seconds()
    delay: float | None = 0.1
    attempt = 0
    while True:
        try:
            result = fn(owner._db(), attempt)
            if attempt:
                notice(f"reconnected to {shown} after {time.monotonic() - started:.1f} s")
            return result
        except psycopg.Error as exc:
            conn = owner._conn
            if not transient(exc, conn):
                raise
            if attempt == 0 and retry_seconds() > 0:
                notice(retrying_notice(shown, exc))
            delay = _pause(delay, deadline) if delay is not None else None
            if delay is None:
                raise
            if conn is not None:
                with contextlib.suppress(psycopg.Error):
                    conn.close()
            owner._conn = None
            attempt += 1


def _reason(exc: BaseException) -> str:
    """The first line of a database error (psycopg puts details on later lines)."""
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def pipelines_in(url: str, what: str) -> list[str]:
    """The pipeline names with checkpoints (present or rejected) in the database;
    SpecError when the database does not exist (a missing store, as a missing
    directory: exit 2)."""
    psycopg = _psycopg()
    try:
        conn = connect_raw(url, None, what=what)
    except psycopg.Error as exc:
        # psycopg gives no SQLSTATE for a refused connection: the server's words
        if getattr(exc, "sqlstate", None) == "3D000" or re.search(
                r'database "[^"]*" does not exist', str(exc)):
            raise SpecError(f"checkpoint database {what} does not exist "
                            f"({_reason(exc)})") from None
        more = retried_for() if transient(exc) else ""
        raise CheckpointError(f"cannot connect to {what}: {_reason(exc)}{more}") from None
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

        self.url = url
        self.pipeline = pipeline
        self._shown = shown or redact(url)
        self.root = Path(self._shown)  # only ever used in messages
        self._conn: Any = None
        self._ready = False
        self._migrated = False
        #: (generation, backend pid of the lock's session) while :meth:`locked` holds
        self._fence: tuple[int, int] | None = None
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

    def _retrying(self, fn: Callable[[Any, int], T]) -> T:
        """See :func:`reconnecting`."""
        return reconnecting(self, fn, self._shown)

    def _failed(self, what: str, exc: BaseException) -> CheckpointError:
        more = retried_for() if transient(exc, self._conn) else ""
        return CheckpointError(f"cannot {what} {self._shown}: {_reason(exc)}{more}")

    def _tables_exist(self, conn: Any) -> bool:
        if self._ready:
            return True
        row = conn.execute(
            "SELECT to_regclass('sealstream_checkpoint_files') IS NOT NULL").fetchone()
        self._ready = bool(row[0])
        return self._ready

    def _query(self, sql: str, *args: Any) -> list[tuple[Any, ...]]:
        def run(conn: Any, _attempt: int) -> list[tuple[Any, ...]]:
            if not self._tables_exist(conn):
                return []
            return list(conn.execute(sql, (self.pipeline, *args)).fetchall())

        try:
            return self._retrying(run)
        except _psycopg().Error as exc:
            raise self._failed("read checkpoints in", exc) from None

    # ------------------------------------------------------------ reading
    def exists(self) -> bool:
        try:
            return self._retrying(lambda conn, _a: self._tables_exist(conn))
        except _psycopg().Error as exc:
            raise self._failed("read checkpoints in", exc) from None

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
        if self._migrated:
            return

        def create(conn: Any, _attempt: int) -> None:
            with conn.transaction():
                # concurrent first runs must not race on CREATE TABLE IF NOT EXISTS
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (lock_key(""),))
                conn.execute(SCHEMA)
                have = {str(r[0]) for r in conn.execute(
                    "SELECT column_name FROM information_schema.columns WHERE table_name = "
                    "'sealstream_lock_holders' AND table_schema = current_schema()")}
                for col, decl in _LOCK_COLUMNS.items():  # a table of an older version
                    if col not in have:
                        conn.execute(
                            f"ALTER TABLE sealstream_lock_holders ADD COLUMN {col} {decl}")

        try:
            self._retrying(create)
        except psycopg.Error as exc:
            raise self._failed("create the checkpoint tables in", exc) from None
        self._ready = self._migrated = True

    transactional = True

    def _lost(self, why: str) -> LockHeldError:
        return LockHeldError(
            f"the lock on the checkpoints of pipeline {self.pipeline!r} in {self._shown} "
            f"was lost while this run held it ({why}); nothing more was committed. "
            "Run again: the job resumes from its last checkpoint")

    def _check_fence(self, conn: Any, *, hold: bool = True, share: bool = False) -> None:
        """Inside the caller's transaction (``hold``: locking the holder row until it
        ends; ``share``: in share mode, so that several workers' writes proceed
        together while a run taking the lock waits for all of them): LockHeldError
        unless this run still holds the job's lock. A no-op for a store that is not
        :meth:`locked` (nor given a :meth:`fence`)."""
        fence = self._fence
        if fence is None:
            return
        key = lock_key(self.pipeline)
        row = conn.execute(
            "SELECT h.generation, h.backend_pid, EXISTS (SELECT 1 FROM pg_locks l "
            "WHERE l.locktype = 'advisory' AND l.granted AND l.pid = h.backend_pid "
            "AND l.classid::bigint = %s AND l.objid::bigint = %s AND l.objsubid = 1 "
            "AND l.database = (SELECT oid FROM pg_database "
            "WHERE datname = current_database())) "
            "FROM sealstream_lock_holders h WHERE h.pipeline = %s"
            + ((" FOR SHARE OF h" if share else " FOR UPDATE OF h") if hold else ""),
            ((key >> 32) & 0xFFFFFFFF, key & 0xFFFFFFFF, self.pipeline)).fetchone()
        if row is None or (int(row[0]), row[1]) != fence:
            raise self._lost("another run took it")
        if not row[2]:
            raise self._lost("its database session ended")

    def check_lock(self) -> None:
        """LockHeldError when this locked store no longer holds the job's lock (the
        engine asks before committing output after a checkpoint)."""
        psycopg = _psycopg()
        if self._fence is None:
            return
        try:
            self._retrying(lambda conn, _a: self._check_fence(conn, hold=False))
        except psycopg.Error as exc:
            raise self._failed("check the lock in", exc) from None

    def _claim(self, cid: int) -> Callable[[Any, int], None]:
        def claim(conn: Any, attempt: int) -> None:
            with conn.transaction():
                self._check_fence(conn)
                if attempt and conn.execute(
                        "SELECT 1 FROM sealstream_checkpoints WHERE pipeline = %s AND id = %s",
                        (self.pipeline, cid)).fetchone() is not None:
                    return  # the lost attempt's claim went through
                conn.execute("INSERT INTO sealstream_checkpoints (pipeline, id) "
                             "VALUES (%s, %s)", (self.pipeline, cid))
        return claim

    direct_parts = True

    def claim(self, cid: int) -> None:
        """Insert checkpoint ``cid``'s row (fenced; fails when the id is taken)."""
        psycopg = _psycopg()
        self.ensure_root()
        try:
            self._retrying(self._claim(cid))
        except psycopg.Error as exc:
            what = ("already exists" if isinstance(exc, psycopg.errors.UniqueViolation)
                    else _reason(exc) + (retried_for() if transient(exc, self._conn) else ""))
            raise CheckpointError(
                f"cannot write checkpoint {cid} in {self._shown}: {what}; "
                "the previous checkpoints are intact") from None

    def fence(self) -> list[int] | None:
        """This run's fencing token: the lock's generation and its session's backend
        pid (while :meth:`locked` holds it), else None."""
        return None if self._fence is None else list(self._fence)

    def write_part(self, cid: int, name: str, data: bytes, fence: Any) -> None:
        """See :meth:`CheckpointStore.write_part`: one committed transaction that
        locks the job's holder row in share mode and checks the generation and the
        lock's session (the run's :meth:`fence`, as every commit of the run does),
        locks the checkpoint's row in share mode (it must exist: claimed, not moved
        aside nor dropped meanwhile), checks that no manifest is published, and
        inserts the part (fails when present). A run taking the lock over bumps the
        generation only after such a transaction ends, so no part lands in a
        checkpoint of the new holder (whose ids are above every id used)."""
        psycopg = _psycopg()
        if not _PART_FILE.fullmatch(name):
            raise CheckpointError(f"checkpoint {cid}: {name!r} is not a state part's name")
        if fence is not None:
            if not (isinstance(fence, list | tuple) and len(fence) == 2
                    and all(isinstance(x, int) and not isinstance(x, bool) for x in fence)):
                raise CheckpointError(f"checkpoint {cid}: malformed fencing token {fence!r}")
            self._fence = (int(fence[0]), int(fence[1]))
        d = checkpoint_dirname(cid)
        rel, mrel = f"{d}/{name}", f"{d}/{MANIFEST_NAME}"
        sealed = self._seal(rel, data)

        def run(conn: Any, attempt: int) -> None:
            with conn.transaction():
                self._check_fence(conn, share=True)
                if conn.execute(
                        "SELECT 1 FROM sealstream_checkpoints WHERE pipeline = %s AND id = %s "
                        "FOR SHARE", (self.pipeline, cid)).fetchone() is None:
                    raise CheckpointError(
                        f"cannot write {rel} in {self._shown}: checkpoint {cid} is not being "
                        "written (never claimed, moved aside or dropped)")
                if conn.execute(
                        "SELECT 1 FROM sealstream_checkpoint_files WHERE pipeline = %s "
                        "AND name = %s", (self.pipeline, mrel)).fetchone() is not None:
                    raise CheckpointError(f"cannot write {rel} in {self._shown}: checkpoint "
                                          f"{cid} is already published")
                if attempt:  # the lost attempt's row, if it went through
                    conn.execute("DELETE FROM sealstream_checkpoint_files WHERE "
                                 "pipeline = %s AND id = %s AND name = %s",
                                 (self.pipeline, cid, rel))
                conn.execute(
                    "INSERT INTO sealstream_checkpoint_files (pipeline, id, name, data) "
                    "VALUES (%s, %s, %s, %s)", (self.pipeline, cid, rel, sealed))

        try:
            self._retrying(run)
        except psycopg.Error as exc:
            what = ("already exists" if isinstance(exc, psycopg.errors.UniqueViolation)
                    else _reason(exc) + (retried_for() if transient(exc, self._conn) else ""))
            raise CheckpointError(f"cannot write {rel} in {self._shown}: {what}") from None

    def write_checkpoint(self, cid: int, files: dict[str, bytes], manifest: bytes,
                         crash: Any = None,
                         in_publish: Callable[[Any], None] | None = None,
                         claimed: bool = False) -> None:
        """See :meth:`CheckpointStore.write_checkpoint`. ``in_publish(conn)`` runs in
        the transaction that publishes the manifest (a sink's rows in this database
        commit exactly with the checkpoint); it may run again on a new connection
        when the connection was lost before that transaction committed."""
        psycopg = _psycopg()
        self.ensure_root()
        d = checkpoint_dirname(cid)
        mrel = f"{d}/{MANIFEST_NAME}"
        already = claimed

        def put(rel: str, blob: bytes) -> Callable[[Any, int], None]:
            def run(conn: Any, attempt: int) -> None:
                with conn.transaction():  # fenced: no row lands after another run took over
                    self._check_fence(conn)
                    if attempt:  # the lost attempt's row, if it went through (the id is ours)
                        conn.execute("DELETE FROM sealstream_checkpoint_files WHERE "
                                     "pipeline = %s AND id = %s AND name = %s",
                                     (self.pipeline, cid, rel))
                    conn.execute(
                        "INSERT INTO sealstream_checkpoint_files (pipeline, id, name, data) "
                        "VALUES (%s, %s, %s, %s)", (self.pipeline, cid, rel, blob))
            return run

        def publish(conn: Any, attempt: int) -> None:
            if attempt:  # never repeat blindly: did the lost commit go through?
                row = conn.execute(
                    "SELECT data FROM sealstream_checkpoint_files WHERE pipeline = %s "
                    "AND name = %s", (self.pipeline, mrel)).fetchone()
                if row is not None and bytes(row[0]) == sealed:
                    return
            with conn.transaction():  # the publish
                self._check_fence(conn)
                if in_publish is not None:
                    in_publish(conn)
                conn.execute(
                    "INSERT INTO sealstream_checkpoint_files (pipeline, id, name, data) "
                    "VALUES (%s, %s, %s, %s)", (self.pipeline, cid, mrel, sealed))

        try:
            if not already:
                self._retrying(self._claim(cid))
            claimed = True
            for name, data in files.items():
                rel = f"{d}/{name}"
                self._retrying(put(rel, self._seal(rel, data)))
                if crash is not None:
                    crash(f"after_write_{name.split('.')[0]}")
            sealed = self._seal(mrel, manifest)
            if crash is not None:
                crash("before_manifest_publish")
            self._retrying(publish)
        except psycopg.Error as exc:
            conn = self._conn
            if claimed and conn is not None:
                with contextlib.suppress(psycopg.Error):
                    if conn.info.transaction_status == 0 and self._raw(mrel) is None:
                        self._drop(conn, cid)
            if isinstance(exc, psycopg.errors.UniqueViolation):
                what = "already exists"
            else:
                what = _reason(exc) + (retried_for() if transient(exc, conn) else "")
            raise CheckpointError(
                f"cannot write checkpoint {cid} in {self._shown}: {what}; "
                "the previous checkpoints are intact"
            ) from None

    def _drop(self, conn: Any, cid: int) -> None:
        with conn.transaction():
            self._check_fence(conn)
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
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())

        def move(conn: Any, _attempt: int) -> bool:
            with conn.transaction():
                self._check_fence(conn)
                gone = conn.execute(
                    "DELETE FROM sealstream_checkpoints WHERE pipeline = %s AND id = %s",
                    (self.pipeline, cid)).rowcount == 0
                if gone:
                    return False
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
            return True

        try:
            moved = self._retrying(move)
        except psycopg.Error as exc:
            raise self._failed(f"move checkpoint {cid} aside in", exc) from None
        return f"rejected/{checkpoint_dirname(cid)}-{reason}-{stamp}" if moved else None

    def delete(self, cid: int) -> None:
        psycopg = _psycopg()
        if not self.exists():
            return
        try:
            self._retrying(lambda conn, _a: self._drop(conn, cid))
        except psycopg.Error as exc:
            raise self._failed(f"delete checkpoint {cid} in", exc) from None

    def clear_trash(self) -> None:
        """Nothing to finish: a deletion is one transaction."""

    # ------------------------------------------------------------ shared blobs
    def write_shared(self, rel: str, data: bytes) -> None:
        psycopg = _psycopg()
        self.ensure_root()
        blob = self._seal(rel, data)

        def run(conn: Any, _attempt: int) -> None:
            with conn.transaction():
                self._check_fence(conn)
                conn.execute(  # content-addressed: one already there is the same
                    "INSERT INTO sealstream_checkpoint_files (pipeline, id, name, data) "
                    "VALUES (%s, %s, %s, %s) ON CONFLICT DO NOTHING",
                    (self.pipeline, SHARED_ID, rel, blob))

        try:
            self._retrying(run)
        except psycopg.Error as exc:
            raise self._failed(f"write {rel} in", exc) from None

    # ------------------------------------------------------------ step plans
    # rows of sealstream_checkpoint_files with id PLAN_ID, named plans/step-N.json
    def write_plan(self, step: int, data: bytes) -> None:
        from sealstream.checkpoint.plans import plan_name

        psycopg = _psycopg()
        self.ensure_root()
        rel = plan_name(step)
        blob = self._seal(rel, data)

        def run(conn: Any, attempt: int) -> None:
            with conn.transaction():
                self._check_fence(conn)
                if attempt and conn.execute(
                        "SELECT 1 FROM sealstream_checkpoint_files WHERE pipeline = %s "
                        "AND name = %s", (self.pipeline, rel)).fetchone() is not None:
                    return  # the lost attempt's insert went through
                conn.execute(
                    "INSERT INTO sealstream_checkpoint_files (pipeline, id, name, data) "
                    "VALUES (%s, %s, %s, %s)", (self.pipeline, PLAN_ID, rel, blob))

        try:
            self._retrying(run)
        except psycopg.Error as exc:
            raise self._failed(f"write the plan of step {step} in", exc) from None

    def plan_steps(self) -> list[int]:
        from sealstream.checkpoint.plans import parse_plan_name

        rows = self._query("SELECT name FROM sealstream_checkpoint_files WHERE pipeline = %s "
                           "AND id = %s", PLAN_ID)
        steps = [parse_plan_name(str(r[0])) for r in rows]
        return sorted(s for s in steps if s is not None)

    def delete_plans(self, steps: list[int]) -> None:
        from sealstream.checkpoint.plans import plan_name

        psycopg = _psycopg()
        if not steps:
            return
        names = [plan_name(s) for s in steps]

        def run(conn: Any, _attempt: int) -> None:
            with conn.transaction():
                self._check_fence(conn)
                conn.execute("DELETE FROM sealstream_checkpoint_files WHERE pipeline = %s "
                             "AND id = %s AND name = ANY(%s)", (self.pipeline, PLAN_ID, names))

        try:
            self._retrying(run)
        except psycopg.Error as exc:
            raise self._failed("delete step plans in", exc) from None

    def move_plan_aside(self, step: int, reason: str) -> None:
        from sealstream.checkpoint.plans import plan_name

        psycopg = _psycopg()
        rel = plan_name(step)

        def run(conn: Any, _attempt: int) -> None:
            with conn.transaction():
                self._check_fence(conn)
                conn.execute(
                    "INSERT INTO sealstream_rejected (pipeline, id, reason, name, data) "
                    "SELECT pipeline, id, %s, name, data FROM sealstream_checkpoint_files "
                    "WHERE pipeline = %s AND id = %s AND name = %s",
                    (reason, self.pipeline, PLAN_ID, rel))
                conn.execute("DELETE FROM sealstream_checkpoint_files WHERE pipeline = %s "
                             "AND id = %s AND name = %s", (self.pipeline, PLAN_ID, rel))

        try:
            self._retrying(run)
        except psycopg.Error as exc:
            raise self._failed(f"move the plan of step {step} aside in", exc) from None


    # ------------------------------------------------------------ lock
    def _holder_name(self) -> str:
        return f"sealstream pid={os.getpid()} host={socket.gethostname()}"[:63]

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Hold this pipeline's advisory lock for the run; LockHeldError names the
        holder. While it is held, every commit of this store checks it (fencing,
        see the module docstring); on exit it is released before returning."""
        psycopg = _psycopg()
        self.ensure_root()
        # keepalives: a cut network is noticed by the server (which frees the lock)
        conn = connect(self.url, self._shown, application_name=self._holder_name(),
                       keepalives=1, keepalives_idle=30, keepalives_interval=10,
                       keepalives_count=3)
        key = lock_key(self.pipeline)
        try:
            try:
                got = conn.execute("SELECT pg_try_advisory_lock(%s)", (key,)).fetchone()[0]
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
            try:
                # the lock's session idles for the whole run: a server's
                # idle_session_timeout (PostgreSQL 14+) must not end it
                with contextlib.suppress(psycopg.Error):
                    conn.execute("SELECT set_config('idle_session_timeout', '0', false)")
                # the fencing token: a new generation, waiting for the commit of a run
                # that lost the lock, if one is in flight (it holds this row)
                row = self._bump_generation(conn, info)
            except psycopg.Error as exc:
                raise CheckpointError(
                    f"cannot lock the checkpoints of pipeline {self.pipeline!r} in "
                    f"{self._shown}: {_reason(exc)}") from None
            self._fence = (int(row[0]), int(row[1]))
            try:
                yield
            except BaseException:
                self._fence = None
                self._release(conn, key, quiet=True)
                raise
            self._fence = None
            self._release(conn, key, quiet=False)
        finally:
            self._fence = None
            conn.close()  # ends the session: the server releases a lock still held

    #: how long the generation bump waits quietly for a commit in flight of the run
    #: that held the lock before; then it says what it waits for, and goes on waiting
    BUMP_QUIET_S = 5.0

    def _bump_generation(self, conn: Any, info: str) -> Any:
        """The new generation and this session's pid. A run that lost the lock may be
        inside a commit, holding the row: wait for it (its commit then fails the fence
        or lands before this run reads the store), with one line on stderr when that
        takes more than :attr:`BUMP_QUIET_S` (a stopped or frozen process holds it)."""
        psycopg = _psycopg()
        sql = ("INSERT INTO sealstream_lock_holders (pipeline, holder, generation, "
               "backend_pid) VALUES (%s, %s, 1, pg_backend_pid()) ON CONFLICT (pipeline) "
               "DO UPDATE SET holder = EXCLUDED.holder, "
               "generation = sealstream_lock_holders.generation + 1, "
               "backend_pid = EXCLUDED.backend_pid RETURNING generation, backend_pid")
        conn.execute("SELECT set_config('lock_timeout', %s, false)",
                     (f"{int(self.BUMP_QUIET_S * 1000)}ms",))
        try:
            return conn.execute(sql, (self.pipeline, info)).fetchone()
        except psycopg.errors.LockNotAvailable:
            before = conn.execute("SELECT holder FROM sealstream_lock_holders "
                                  "WHERE pipeline = %s", (self.pipeline,)).fetchone()
            notice(f"waiting for a commit of the run that held the lock on pipeline "
                   f"{self.pipeline!r} before ({before[0] if before else 'unknown'}) to "
                   "end: its process may be stopped or frozen; that commit lands or "
                   "fails before this run reads the checkpoints")
            conn.execute("SELECT set_config('lock_timeout', '0', false)")
            return conn.execute(sql, (self.pipeline, info)).fetchone()
        finally:
            with contextlib.suppress(psycopg.Error):
                conn.execute("SELECT set_config('lock_timeout', '0', false)")

    def _release(self, conn: Any, key: int, *, quiet: bool) -> None:
        """Release the lock before the connection closes (closing alone lets the
        server release it a moment later: a run started right after could be
        refused). ``quiet``: another error is on its way, report nothing."""
        psycopg = _psycopg()
        why = "its database session ended"
        try:
            if conn.execute("SELECT pg_advisory_unlock(%s)", (key,)).fetchone()[0]:
                return
        except psycopg.Error as exc:
            if not transient(exc, conn):
                why = _reason(exc)
        if not quiet:
            raise self._lost(why)

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
