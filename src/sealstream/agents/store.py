"""Row stores for agent checkpoints: SQLite (embedded default) and PostgreSQL.

Everything the agent layer persists is a *row*: an opaque, already sealed blob
addressed by ``(space, execution, namespace, name)``::

    space   what the row is: "cp" a checkpoint manifest, "blob" a channel value,
            "w" a pending write, "wi" a checkpoint's writes index, "meta" the
            head/retention marker of a history, "fx" an effect-ledger entry,
            "ap" an approval request or decision
    execution  the stable execution id (LangGraph: the thread id)
    namespace  "" for the root graph, "child:..." for subgraphs
    name    the row's id within its space

One table holds them all; a backend only moves bytes. It never interprets a row:
signing, encryption and verdicts live in :mod:`sealstream.agents.checkpoint`.

Transactions: :meth:`RowStore.transaction` yields a :class:`RowTx`; everything done
through it commits together or not at all (SQLite: ``BEGIN IMMEDIATE``, WAL,
``synchronous=FULL``; PostgreSQL: one transaction, ``SELECT ... FOR UPDATE`` for
:meth:`RowTx.get` with ``lock=True``). :meth:`RowTx.insert` is create-if-absent:
it returns False, changing nothing, when the row exists.

>>> import tempfile, pathlib
>>> store = SqliteRowStore(pathlib.Path(tempfile.mkdtemp()) / "agents.db")
>>> with store.transaction() as tx:
...     tx.insert("fx", "exec-1", "", "k1", b"sealed bytes")
True
>>> store.get("fx", "exec-1", "", "k1")
b'sealed bytes'
>>> store.close()
"""

from __future__ import annotations

import abc
import contextlib
import errno
import hashlib
import json
import os
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sealstream._fs import open_no_follow, os_reason
from sealstream.checkpoint._sqlite_tx import immediate
from sealstream.errors import CheckpointError, LockHeldError

_SQLITE_SCHEMA = """
CREATE TABLE IF NOT EXISTS agent_rows (
    space TEXT NOT NULL,
    execution TEXT NOT NULL,
    ns TEXT NOT NULL,
    name TEXT NOT NULL,
    data BLOB NOT NULL,
    PRIMARY KEY (space, execution, ns, name)
);
"""

# names compare bytewise (COLLATE "C": pending writes by checkpoint prefix, the newest
# checkpoints first) whatever the database's collation, so the primary key serves
# every statement: equality, ranges and order. Every statement spells the collation
# out (``name COLLATE "C"``), so a table made by an earlier version (``name`` in the
# database's collation) is served by its extra index, :data:`_PG_INDEX`.
_PG_SCHEMA = """
CREATE TABLE IF NOT EXISTS agent_rows (
    space TEXT NOT NULL,
    execution TEXT NOT NULL,
    ns TEXT NOT NULL,
    name TEXT COLLATE "C" NOT NULL,
    data BYTEA NOT NULL,
    PRIMARY KEY (space, execution, ns, name)
)
"""

_PG_NAME_COLLATION = """
SELECT c.collname FROM pg_attribute a JOIN pg_collation c ON c.oid = a.attcollation
WHERE a.attrelid = 'agent_rows'::regclass AND a.attname = 'name'
"""

# only for a table made before ``name`` was "C" (its primary key cannot serve ranges)
_PG_INDEX = """
CREATE INDEX IF NOT EXISTS agent_rows_c_names
ON agent_rows (space, execution, ns, name COLLATE "C")
"""


@dataclass(frozen=True)
class Row:
    """One stored row, as read."""

    space: str
    execution: str
    ns: str
    name: str
    data: bytes


class RowTx(abc.ABC):
    """The operations allowed inside one transaction."""

    @abc.abstractmethod
    def get(self, space: str, execution: str, ns: str, name: str,
            *, lock: bool = False) -> bytes | None:
        """The row's bytes, or None; ``lock`` holds it until the transaction ends."""

    @abc.abstractmethod
    def insert(self, space: str, execution: str, ns: str, name: str, data: bytes) -> bool:
        """Create the row if absent; False (and no change) when it exists."""

    @abc.abstractmethod
    def upsert(self, space: str, execution: str, ns: str, name: str, data: bytes) -> None:
        """Create or replace the row (only for mutable rows: indexes, markers)."""

    @abc.abstractmethod
    def delete(self, space: str, execution: str, ns: str | None = None,
               names: Sequence[str] | None = None) -> int:
        """Delete rows of ``execution`` in ``space`` (a namespace, named ones); the count."""

    @abc.abstractmethod
    def scan(self, space: str, execution: str | None, ns: str | None = None,
             prefix: str | None = None) -> list[Row]:
        """Rows of a space (one execution, or all with None; names starting with
        ``prefix``), ordered by execution, namespace and name (bytewise)."""

    def keys(self, space: str, execution: str | None, ns: str | None = None, *,
             before: str | None = None, limit: int | None = None,
             newest_first: bool = True) -> list[tuple[str, str, str]]:
        """``(name, execution, ns)`` of rows, without their data, ordered by name
        (then execution, namespace), newest (largest) first; names below ``before``;
        at most ``limit``: constant work for a bounded ``limit``."""
        rows = [(r.name, r.execution, r.ns) for r in self.scan(space, execution, ns)]
        rows = sorted((k for k in rows if before is None or k[0] < before),
                      reverse=newest_first)
        return rows if limit is None else rows[:limit]

    def checkpoint_rows(self, execution: str, ns: str, cid: str, writes_prefix: str
                        ) -> tuple[bytes | None, bytes | None, list[Row]]:
        """A checkpoint's manifest, writes index and pending writes (names starting
        with ``writes_prefix``), in one statement (see :meth:`fetch`)."""
        return self.checkpoints_rows(execution, ns, [cid], [writes_prefix])[cid]

    def checkpoints_rows(self, execution: str, ns: str, cids: Sequence[str],
                         writes_prefixes: Sequence[str]
                         ) -> dict[str, tuple[bytes | None, bytes | None, list[Row]]]:
        """:meth:`checkpoint_rows` of several checkpoints of one history (``cids[i]``'s
        pending writes start with ``writes_prefixes[i]``), as :meth:`fetch` reads them."""
        return self.fetch(execution, ns, cids, writes_prefixes, (), False)[0]

    @abc.abstractmethod
    def fetch(self, execution: str, ns: str, cids: Sequence[str],
              writes_prefixes: Sequence[str], blobs: Sequence[str], meta: bool
              ) -> tuple[dict[str, tuple[bytes | None, bytes | None, list[Row]]],
                         dict[str, bytes], bytes | None]:
        """The manifests, writes indexes and pending writes of ``cids`` (``cids[i]``'s
        writes start with ``writes_prefixes[i]``; no writes when ``writes_prefixes``
        is empty), the ``blob`` rows named ``blobs`` that exist and (with ``meta``)
        the history's head marker, in as few statements as the backend allows
        (primary-key lookups and key ranges: one statement for a checkpoint)."""

    def get_many(self, space: str, execution: str, ns: str, names: Sequence[str]
                 ) -> dict[str, bytes]:
        """The rows named ``names`` that exist."""
        out = {}
        for name in names:
            data = self.get(space, execution, ns, name)
            if data is not None:
                out[name] = data
        return out

    #: rows read ahead by :meth:`prefetch` (None: known absent); writes through this
    #: transaction forget them
    seen: dict[tuple[str, str, str, str], bytes | None]

    def prefetch(self, execution: str, ns: str, cids: Sequence[str],
                 blobs: Sequence[str] = ()) -> None:
        """Read a history's head marker, the manifests of ``cids`` and the ``blob``
        rows named ``blobs`` (present or not) in one round trip, so that :meth:`get`
        of them in this transaction needs none (call it once the history is locked:
        :meth:`lock_history`)."""
        rows, found, marker = self.fetch(execution, ns, cids, (), blobs, True)
        self.seen[("meta", execution, ns, "history")] = marker
        for cid in cids:
            self.seen[("cp", execution, ns, cid)] = rows[cid][0]
        for name in blobs:
            self.seen[("blob", execution, ns, name)] = found.get(name)

    def insert_many(self, space: str, execution: str, ns: str, rows: dict[str, bytes]
                    ) -> set[str]:
        """:meth:`insert` of several rows; the names actually inserted."""
        return {name for name, data in rows.items()
                if self.insert(space, execution, ns, name, data)}

    def add(self, space: str, execution: str, ns: str, name: str, data: bytes) -> None:
        """:meth:`insert` whose outcome is not needed: a backend may send it later,
        with the next statement whose result is (PostgreSQL: in a pipeline)."""
        self.insert(space, execution, ns, name, data)

    def add_many(self, space: str, execution: str, ns: str, rows: dict[str, bytes]) -> None:
        """:meth:`insert_many` whose outcome is not needed (see :meth:`add`)."""
        self.insert_many(space, execution, ns, rows)

    def lock_history(self, execution: str, ns: str) -> None:
        """Serialize writers of one history until the transaction ends (a no-op where
        transactions are serialized anyway: SQLite's ``BEGIN IMMEDIATE``)."""
        return None


class RowStore(abc.ABC):
    """A database of rows; see the module docstring.

    SQLite: one connection per store, shared by threads, transactions serialized by
    a lock. PostgreSQL: a connection pool (``pool_size`` connections), transactions
    run concurrently; writers of one history serialize on a transaction-scoped
    advisory lock (:meth:`RowTx.lock_history`).
    """

    location: str
    _lock: threading.RLock
    #: how many transactions may usefully run at once (the saver's async worker count)
    parallelism: int = 1

    @abc.abstractmethod
    def transaction(self) -> contextlib.AbstractContextManager[RowTx]:
        """One atomic unit of work; committed when the block exits normally."""

    #: whether :meth:`reading` runs each statement on its own (no snapshot across
    #: statements): a reader that finds something that does not verify must then
    #: read again in a :meth:`transaction` before it reports it
    reads_without_snapshot: bool = False

    def reading(self) -> contextlib.AbstractContextManager[RowTx]:
        """A read-only unit of work; by default a :meth:`transaction`. PostgreSQL:
        statements in autocommit, without BEGIN/COMMIT round trips (see
        :attr:`reads_without_snapshot`)."""
        return self.transaction()

    @abc.abstractmethod
    def close(self) -> None:
        """Release the connection (reopened on the next use)."""

    @abc.abstractmethod
    def execution_lock(self, execution: str, ns: str, *, timeout: float = 0.0
                       ) -> contextlib.AbstractContextManager[None]:
        """Hold the exclusive lock of one execution (and namespace) across
        processes and hosts sharing the store; the operating system (SQLite: an
        ``flock`` on ``<db>.locks/<hash>.lock``) or the server (PostgreSQL: a session
        advisory lock on its own connection) releases it when the holder dies.
        Raises :class:`~sealstream.errors.LockHeldError` when another holder keeps
        it for longer than ``timeout`` seconds. Not reentrant."""

    def get(self, space: str, execution: str, ns: str, name: str) -> bytes | None:
        with self.transaction() as tx:
            return tx.get(space, execution, ns, name)

    def scan(self, space: str, execution: str | None, ns: str | None = None,
             prefix: str | None = None) -> list[Row]:
        with self.transaction() as tx:
            return tx.scan(space, execution, ns, prefix)

    def executions(self, space: str) -> list[str]:
        """The execution ids with rows in ``space``."""
        return sorted({r.execution for r in self.scan(space, None)})

    def __enter__(self) -> RowStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def lock_digest(execution: str, ns: str) -> bytes:
    """The SHA-256 naming the lock of one execution and namespace."""
    return hashlib.sha256(json.dumps(["sealstream-agent-lock", execution, ns],
                                     separators=(",", ":")).encode()).digest()


def _poll(try_once: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + max(0.0, timeout)
    while not try_once():
        if time.monotonic() >= deadline:
            raise LockHeldError(f"{what} is held by another runner (one writer per "
                                "execution: wait for it, or make sure it is dead)")
        time.sleep(0.01)


def _blob(value: Any) -> bytes:
    """A stored value as bytes. SQLite keeps whatever type was written, so a row
    edited by hand may come back as TEXT or INTEGER; it is read as (unverifiable)
    bytes, never as an exception or ``bytes(n)`` (n zero bytes)."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    return str(value).encode("utf-8", "surrogateescape")


def _after(prefix: str) -> str:
    """The first name after every name that starts with ``prefix`` (a range's end)."""
    return prefix[:-1] + chr(ord(prefix[-1]) + 1)


def _where(space: str, execution: str | None, ns: str | None,
           names: Sequence[str] | None, mark: str, prefix: str | None = None,
           collate: str = "") -> tuple[str, list[Any]]:
    sql, args = "space = " + mark, [space]
    if prefix:
        sql += f" AND name{collate} >= {mark} AND name{collate} < {mark}"
        args.extend([prefix, _after(prefix)])
    if execution is not None:
        sql += " AND execution = " + mark
        args.append(execution)
    if ns is not None:
        sql += " AND ns = " + mark
        args.append(ns)
    if names is not None:
        sql += f" AND name{collate} IN (" + ", ".join([mark] * len(names)) + ")"
        args.extend(names)
    return sql, args


def _keys_sql(space: str, execution: str | None, ns: str | None, before: str | None,
              limit: int | None, newest_first: bool, mark: str, collate: str
              ) -> tuple[str, list[Any]]:
    where, args = _where(space, execution, ns, None, mark, collate=collate)
    if before is not None:
        where += f" AND name{collate} < {mark}"
        args.append(before)
    order = "DESC" if newest_first else "ASC"
    # a column fixed by the WHERE clause is left out of the order: the index's own
    # order then serves, with no sort of the whole history
    order_by = [f"name{collate} {order}"] + [
        f"{col}{collate} {order}" for col, fixed in (("execution", execution), ("ns", ns))
        if fixed is None]
    sql = f"SELECT name, execution, ns FROM agent_rows WHERE {where} ORDER BY " + ", ".join(
        order_by)
    if limit is not None:
        sql += f" LIMIT {int(limit)}"
    return sql, args


def _fetched(rows: Sequence[Any], execution: str, ns: str, cids: Sequence[str],
             prefixes: Sequence[str]
             ) -> tuple[dict[str, tuple[bytes | None, bytes | None, list[Row]]],
                        dict[str, bytes], bytes | None]:
    """:meth:`RowTx.fetch`'s answer from ``(space, name, data)`` rows."""
    found: dict[str, list[Any]] = {cid: [None, None, []] for cid in cids}
    owner = dict(zip(prefixes, cids, strict=True)) if prefixes else {}
    blob_rows: dict[str, bytes] = {}
    marker = None
    for space, name, data in rows:
        if space in ("cp", "wi"):
            if name in found:
                found[name][0 if space == "cp" else 1] = _blob(data)
        elif space == "blob":
            blob_rows[name] = _blob(data)
        elif space == "meta":
            marker = _blob(data)
        else:
            of = owner.get(name[:name.find("|") + 1])
            if of is not None:
                found[of][2].append(Row("w", execution, ns, name, _blob(data)))
    out: dict[str, tuple[bytes | None, bytes | None, list[Row]]] = {}
    for cid, (cp, wi, writes) in found.items():
        out[cid] = (cp, wi, sorted(writes, key=lambda r: r.name.encode()))
    return out, blob_rows, marker


# ---------------------------------------------------------------------- SQLite
class _SqliteTx(RowTx):
    def __init__(self, conn: sqlite3.Connection) -> None:
        self._c = conn
        self.seen = {}

    def keys(self, space: str, execution: str | None, ns: str | None = None, *,
             before: str | None = None, limit: int | None = None,
             newest_first: bool = True) -> list[tuple[str, str, str]]:
        sql, args = _keys_sql(space, execution, ns, before, limit, newest_first, "?", "")
        return [(r[0], r[1], r[2]) for r in self._c.execute(sql, args).fetchall()]

    def get_many(self, space: str, execution: str, ns: str, names: Sequence[str]
                 ) -> dict[str, bytes]:
        out: dict[str, bytes] = {}
        names = list(names)
        for i in range(0, len(names), 500):  # SQLite's bound-parameter limit
            where, args = _where(space, execution, ns, names[i:i + 500], "?")
            out.update((r[0], _blob(r[1])) for r in self._c.execute(
                f"SELECT name, data FROM agent_rows WHERE {where}", args).fetchall())
        return out

    def fetch(self, execution: str, ns: str, cids: Sequence[str],
              writes_prefixes: Sequence[str], blobs: Sequence[str], meta: bool
              ) -> tuple[dict[str, tuple[bytes | None, bytes | None, list[Row]]],
                         dict[str, bytes], bytes | None]:
        # one statement per 200 checkpoints (SQLite allows 500 arms in a compound
        # SELECT and a bounded number of parameters): primary-key lookups and ranges
        ids, prefixes, names = list(cids), list(writes_prefixes), list(blobs)
        pick = "SELECT space, name, data FROM agent_rows WHERE execution = ? AND ns = ? AND "
        rows: list[Any] = []
        first = True
        while first or ids or names:
            arms: list[str] = []
            args: list[Any] = []
            part, pparts, ids, prefixes = ids[:200], prefixes[:200], ids[200:], prefixes[200:]
            bpart, names = names[:500], names[500:]
            for spaces, listed in (("IN ('cp', 'wi')", part), ("= 'blob'", bpart)):
                if listed:
                    arms.append(pick + f"space {spaces} AND name IN ("
                                + ", ".join("?" * len(listed)) + ")")
                    args += [execution, ns, *listed]
            for prefix in pparts:
                arms.append(pick + "space = 'w' AND name >= ? AND name < ?")
                args += [execution, ns, prefix, _after(prefix)]
            if first and meta:
                arms.append(pick + "space = 'meta' AND name = 'history'")
                args += [execution, ns]
            first = False
            if arms:
                rows += self._c.execute(" UNION ALL ".join(arms), args).fetchall()
        return _fetched(rows, execution, ns, cids, writes_prefixes)

    def add_many(self, space: str, execution: str, ns: str, rows: dict[str, bytes]) -> None:
        for name in rows:
            self.seen.pop((space, execution, ns, name), None)
        self._c.executemany(
            "INSERT INTO agent_rows (space, execution, ns, name, data) VALUES (?, ?, ?, ?, ?) "
            "ON CONFLICT DO NOTHING",
            [(space, execution, ns, name, data) for name, data in rows.items()])

    def get(self, space: str, execution: str, ns: str, name: str,
            *, lock: bool = False) -> bytes | None:
        if not lock and (space, execution, ns, name) in self.seen:
            return self.seen[(space, execution, ns, name)]
        row = self._c.execute(
            "SELECT data FROM agent_rows WHERE space = ? AND execution = ? AND ns = ? "
            "AND name = ?", (space, execution, ns, name)).fetchone()
        return _blob(row[0]) if row is not None else None

    def insert(self, space: str, execution: str, ns: str, name: str, data: bytes) -> bool:
        self.seen.pop((space, execution, ns, name), None)
        cur = self._c.execute(
            "INSERT INTO agent_rows (space, execution, ns, name, data) VALUES (?, ?, ?, ?, ?) "
            "ON CONFLICT DO NOTHING", (space, execution, ns, name, data))
        return cur.rowcount == 1

    def upsert(self, space: str, execution: str, ns: str, name: str, data: bytes) -> None:
        self.seen.pop((space, execution, ns, name), None)
        self._c.execute(
            "INSERT INTO agent_rows (space, execution, ns, name, data) VALUES (?, ?, ?, ?, ?) "
            "ON CONFLICT (space, execution, ns, name) DO UPDATE SET data = excluded.data",
            (space, execution, ns, name, data))

    def delete(self, space: str, execution: str, ns: str | None = None,
               names: Sequence[str] | None = None) -> int:
        if names is not None and not names:
            return 0
        self.seen.clear()
        where, args = _where(space, execution, ns, names, "?")
        return int(self._c.execute(f"DELETE FROM agent_rows WHERE {where}", args).rowcount)

    def scan(self, space: str, execution: str | None, ns: str | None = None,
             prefix: str | None = None) -> list[Row]:
        where, args = _where(space, execution, ns, None, "?", prefix)
        rows = self._c.execute(
            f"SELECT space, execution, ns, name, data FROM agent_rows WHERE {where} "
            "ORDER BY execution, ns, name", args).fetchall()
        return [Row(r[0], r[1], r[2], r[3], _blob(r[4])) for r in rows]


class SqliteRowStore(RowStore):
    """Rows in one SQLite file (created 0600 on first use); the embedded default."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self.location = f"sqlite:///{self.path}"
        self._conn: sqlite3.Connection | None = None
        self._lock = threading.RLock()

    def _db(self) -> sqlite3.Connection:
        if self._conn is None:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
                if not self.path.exists():
                    os.close(os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o600))
                conn = sqlite3.connect(self.path, isolation_level=None, timeout=30.0,
                                       check_same_thread=False)
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute("PRAGMA synchronous=FULL")
                conn.executescript(_SQLITE_SCHEMA)
            except (OSError, sqlite3.Error) as exc:
                raise CheckpointError(f"cannot open agent store {self.location}: {exc}") from None
            self._conn = conn
        return self._conn

    @contextlib.contextmanager
    def transaction(self) -> Iterator[RowTx]:
        with self._lock:
            yield from self._transaction()

    reads_without_snapshot = True

    @contextlib.contextmanager
    def reading(self) -> Iterator[RowTx]:
        """Statements in autocommit, each its own snapshot (WAL), without the write
        lock and without BEGIN/COMMIT (two of a head read's three statements): a
        reader that finds something that does not verify reads again in a
        :meth:`transaction` (:attr:`reads_without_snapshot`)."""
        with self._lock:
            conn = self._db()
            try:
                yield _SqliteTx(conn)
            except sqlite3.Error as exc:
                raise CheckpointError(f"agent store {self.location}: {exc}") from None

    def _transaction(self) -> Iterator[RowTx]:
        conn = self._db()
        try:
            # reports the original error; a failed COMMIT is ended
            with immediate(conn):
                yield _SqliteTx(conn)
        except sqlite3.Error as exc:
            raise CheckpointError(f"agent store {self.location}: {exc}") from None

    @contextlib.contextmanager
    def execution_lock(self, execution: str, ns: str, *, timeout: float = 0.0
                       ) -> Iterator[None]:
        import fcntl

        what = f"execution {execution!r}/{ns!r} of {self.location}"
        folder = self.path.with_name(self.path.name + ".locks")
        name = folder / f"{lock_digest(execution, ns).hex()[:40]}.lock"
        try:
            folder.mkdir(parents=True, exist_ok=True, mode=0o700)
            if folder.is_symlink():
                raise CheckpointError(f"cannot lock {what}: {folder} is a symbolic link "
                                      "(refused: remove it and run again)")
            fd = open_no_follow(name, os.O_RDWR | os.O_CREAT)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise CheckpointError(f"cannot lock {what}: {name} is a symbolic link "
                                      "(refused: remove it and run again)") from None
            raise CheckpointError(f"cannot lock {what}: {os_reason(exc)}") from None

        def try_once() -> bool:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
            return True

        try:
            _poll(try_once, timeout, what)
        except BaseException:
            os.close(fd)
            raise
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None


# ------------------------------------------------------------------ PostgreSQL
class _PgTx(RowTx):
    """Statements of one transaction. Writes whose outcome is not needed
    (:meth:`add`, :meth:`add_many`, :meth:`upsert`) are kept and sent as (at most)
    two statements before the next statement or the COMMIT (:meth:`flush`); in a
    pipeline (``pipe``) they and :meth:`lock_history` go with the next statement
    whose result is needed: a checkpoint's save is two round trips."""

    def __init__(self, conn: Any, pipe: Any = None) -> None:
        self._c = conn
        self._pipe = pipe
        self.seen = {}
        self._locked: set[tuple[str, str]] = set()
        self._adds: list[tuple[str, str, str, str, bytes]] = []
        self._upserts: dict[tuple[str, str, str, str], bytes] = {}

    def _x(self, sql: str, args: Any) -> Any:
        self.flush()
        return self._c.execute(sql, args)

    def flush(self) -> None:
        """Send the kept writes: create-if-absent ones, then replacing ones (the same
        outcome as in the order they were made: a row added then replaced, or
        replaced then added, ends replaced)."""
        for rows, conflict in ((self._adds, "DO NOTHING"), (list(
                (*k, v) for k, v in self._upserts.items()),
                "(space, execution, ns, name) DO UPDATE SET data = excluded.data")):
            if rows:
                self._c.execute(
                    "INSERT INTO agent_rows (space, execution, ns, name, data) "
                    "SELECT * FROM unnest(%s::text[], %s::text[], %s::text[], %s::text[], "
                    f"%b::bytea[]) ON CONFLICT {conflict}",
                    [list(col) for col in zip(*rows, strict=True)])
        self._adds = []
        self._upserts = {}

    def _sync(self) -> None:
        if self._pipe is not None:
            self._pipe.sync()

    def keys(self, space: str, execution: str | None, ns: str | None = None, *,
             before: str | None = None, limit: int | None = None,
             newest_first: bool = True) -> list[tuple[str, str, str]]:
        sql, args = _keys_sql(space, execution, ns, before, limit, newest_first, "%s",
                              ' COLLATE "C"')
        return [(r[0], r[1], r[2]) for r in self._x(sql, args).fetchall()]

    def fetch(self, execution: str, ns: str, cids: Sequence[str],
              writes_prefixes: Sequence[str], blobs: Sequence[str], meta: bool
              ) -> tuple[dict[str, tuple[bytes | None, bytes | None, list[Row]]],
                         dict[str, bytes], bytes | None]:
        # each arm a primary-key lookup (every key column equal to a value) or a key
        # range with constant bounds. Not ``name = ANY(...)`` nor a join: on a table
        # the planner has no statistics for yet (a new store), it reads such a
        # condition as a filter over the whole history
        prefixes = list(writes_prefixes)
        arms: list[tuple[str, list[Any]]] = []
        pick = ("SELECT space, name, data FROM agent_rows WHERE execution = %s AND ns = %s "
                "AND ")
        c_range = "name COLLATE \"C\" >= %s AND name COLLATE \"C\" < %s"
        if len(cids) > 16:
            # many checkpoints (a page of a listing: neighbours in the history): two
            # key ranges spanning them; rows in between that were not asked for are
            # dropped below
            arms.append((pick + "space IN ('cp', 'wi') AND name COLLATE \"C\" >= %s AND "
                         "name COLLATE \"C\" <= %s", [execution, ns, min(cids), max(cids)]))
            if prefixes:
                arms.append((pick + "space = 'w' AND " + c_range, [
                    execution, ns, min(prefixes), max(_after(p) for p in prefixes)]))
        else:
            for cid in cids:
                arms.append((pick + "space IN ('cp', 'wi') AND name COLLATE \"C\" = %s",
                             [execution, ns, cid]))
            for prefix in prefixes:
                arms.append((pick + "space = 'w' AND " + c_range,
                             [execution, ns, prefix, _after(prefix)]))
        for blob in blobs:
            arms.append((pick + "space = 'blob' AND name COLLATE \"C\" = %s",
                         [execution, ns, blob]))
        if meta:
            arms.append((pick + "space = 'meta' AND name COLLATE \"C\" = 'history'",
                         [execution, ns]))
        return _fetched(self._union(arms), execution, ns, cids, prefixes)

    def _union(self, arms: Sequence[tuple[str, Sequence[Any]]]) -> list[Any]:
        """The rows of ``arms`` (each a SELECT and its parameters), 64 arms to a
        ``UNION ALL`` statement: one the server plans quickly."""
        rows: list[Any] = []
        for i in range(0, len(arms), 64):
            part = arms[i:i + 64]
            rows += self._x(" UNION ALL ".join(a[0] for a in part),
                            [x for a in part for x in a[1]]).fetchall()
        return rows

    def insert_many(self, space: str, execution: str, ns: str, rows: dict[str, bytes]
                    ) -> set[str]:
        if not rows:
            return set()
        for name in rows:
            self.seen.pop((space, execution, ns, name), None)
        got = self._x(
            "INSERT INTO agent_rows (space, execution, ns, name, data) "
            "SELECT %s, %s, %s, n, d FROM unnest(%s::text[], %b::bytea[]) AS t(n, d) "
            "ON CONFLICT DO NOTHING RETURNING name",
            (space, execution, ns, list(rows), list(rows.values()))).fetchall()
        return {r[0] for r in got}

    def add_many(self, space: str, execution: str, ns: str, rows: dict[str, bytes]) -> None:
        for name, data in rows.items():
            self.add(space, execution, ns, name, data)

    def add(self, space: str, execution: str, ns: str, name: str, data: bytes) -> None:
        self.seen.pop((space, execution, ns, name), None)
        self._adds.append((space, execution, ns, name, data))

    def get_many(self, space: str, execution: str, ns: str, names: Sequence[str]
                 ) -> dict[str, bytes]:
        return {r[0]: _blob(r[1]) for r in self._union([(
            "SELECT name, data FROM agent_rows WHERE space = %s AND execution = %s "
            "AND ns = %s AND name COLLATE \"C\" = %s", (space, execution, ns, name))
            for name in names])}  # primary-key lookups (see fetch)

    def lock_history(self, execution: str, ns: str) -> None:
        if (execution, ns) in self._locked:
            return
        key = int.from_bytes(lock_digest("history:" + execution, ns)[:8], "big", signed=True)
        self._x("SELECT pg_advisory_xact_lock(%s)", (key,))
        self._locked.add((execution, ns))

    def get(self, space: str, execution: str, ns: str, name: str,
            *, lock: bool = False) -> bytes | None:
        if not lock and (space, execution, ns, name) in self.seen:
            return self.seen[(space, execution, ns, name)]
        row = self._x(
            "SELECT data FROM agent_rows WHERE space = %s AND execution = %s AND ns = %s "
            "AND name COLLATE \"C\" = %s" + (" FOR UPDATE" if lock else ""),
            (space, execution, ns, name)).fetchone()
        return _blob(row[0]) if row is not None else None

    def insert(self, space: str, execution: str, ns: str, name: str, data: bytes) -> bool:
        self.seen.pop((space, execution, ns, name), None)
        cur = self._x(
            "INSERT INTO agent_rows (space, execution, ns, name, data) "
            "VALUES (%s, %s, %s, %s, %b) ON CONFLICT DO NOTHING",
            (space, execution, ns, name, data))
        self._sync()
        return int(cur.rowcount) == 1

    def upsert(self, space: str, execution: str, ns: str, name: str, data: bytes) -> None:
        self.seen.pop((space, execution, ns, name), None)
        self._upserts[(space, execution, ns, name)] = data

    def delete(self, space: str, execution: str, ns: str | None = None,
               names: Sequence[str] | None = None) -> int:
        if names is not None and not names:
            return 0
        self.seen.clear()
        where, args = _where(space, execution, ns, names, "%s", collate=' COLLATE "C"')
        cur = self._x(f"DELETE FROM agent_rows WHERE {where}", args)
        self._sync()
        return int(cur.rowcount)

    def scan(self, space: str, execution: str | None, ns: str | None = None,
             prefix: str | None = None) -> list[Row]:
        where, args = _where(space, execution, ns, None, "%s", prefix, ' COLLATE "C"')
        rows = self._x(
            f"SELECT space, execution, ns, name, data FROM agent_rows WHERE {where} "
            "ORDER BY execution COLLATE \"C\", ns COLLATE \"C\", name COLLATE \"C\"",
            args).fetchall()
        return [Row(r[0], r[1], r[2], r[3], _blob(r[4])) for r in rows]


class PostgresRowStore(RowStore):
    """Rows in a PostgreSQL database (psycopg 3), for shared deployments.

    A pool of up to ``pool_size`` connections (psycopg_pool): transactions of
    different threads (and of the async saver's workers) run concurrently.
    Needs the ``postgres`` extra (``pip install sealstream[postgres]``).
    """

    def __init__(self, url: str, *, pool_size: int = 8) -> None:
        self.url = url
        self.location = _redact(url)
        self.parallelism = max(1, int(pool_size))
        self._pool: Any = None
        self._pipelines = False  # libpq >= 14: transactions in pipeline mode
        self._lock = threading.RLock()

    def _db(self) -> Any:
        with self._lock:
            if self._pool is None:
                try:
                    import psycopg
                    from psycopg_pool import ConnectionPool
                except ImportError:
                    raise CheckpointError(
                        "PostgreSQL agent stores need psycopg and psycopg-pool: "
                        "pip install 'sealstream[postgres]'") from None
                try:
                    with psycopg.connect(self.url, autocommit=True, connect_timeout=10) as c:
                        c.execute(_PG_SCHEMA)
                        row = c.execute(_PG_NAME_COLLATION).fetchone()
                        if row is None or row[0] != "C":  # a table of an earlier version
                            c.execute(_PG_INDEX)
                    pool = ConnectionPool(
                        self.url, min_size=1, max_size=self.parallelism, open=False,
                        kwargs={"autocommit": True, "connect_timeout": 10}, timeout=30.0,
                        name="sealstream-agents")
                    pool.open(wait=True, timeout=30.0)
                except psycopg.Error as exc:
                    raise CheckpointError(
                        f"cannot open agent store {self.location}: {str(exc).strip()}"
                    ) from None
                except Exception as exc:  # psycopg_pool.PoolTimeout
                    raise CheckpointError(
                        f"cannot open agent store {self.location}: {exc}") from None
                self._pipelines = psycopg.Pipeline.is_supported()
                self._pool = pool
            return self._pool

    @contextlib.contextmanager
    def transaction(self) -> Iterator[RowTx]:
        import psycopg
        from psycopg_pool import PoolTimeout

        pool = self._db()
        try:
            with pool.connection() as conn:
                if self._pipelines:
                    # BEGIN and COMMIT sent with the statements around them (psycopg's
                    # transaction blocks sync the pipeline on entry and exit: two
                    # round trips more per transaction)
                    with conn.pipeline() as pipe:
                        conn.execute("BEGIN")
                        try:
                            tx = _PgTx(conn, pipe)
                            yield tx
                            tx.flush()
                        except BaseException:
                            with contextlib.suppress(psycopg.Error):
                                conn.execute("ROLLBACK")
                                pipe.sync()
                            raise
                        conn.execute("COMMIT")  # sent and checked as the pipeline ends
                else:
                    with conn.transaction():
                        tx = _PgTx(conn)
                        yield tx
                        tx.flush()
        except psycopg.Error as exc:
            raise CheckpointError(
                f"agent store {self.location}: {str(exc).strip()}") from None
        except PoolTimeout as exc:
            raise CheckpointError(f"agent store {self.location}: {exc}") from None

    reads_without_snapshot = True

    @contextlib.contextmanager
    def reading(self) -> Iterator[RowTx]:
        import psycopg
        from psycopg_pool import PoolTimeout

        pool = self._db()
        try:
            with pool.connection() as conn:  # autocommit: no BEGIN/COMMIT round trips
                tx = _PgTx(conn)
                yield tx
                tx.flush()  # a unit of work meant to read: writes, if any, still land
        except psycopg.Error as exc:
            raise CheckpointError(
                f"agent store {self.location}: {str(exc).strip()}") from None
        except PoolTimeout as exc:
            raise CheckpointError(f"agent store {self.location}: {exc}") from None

    @contextlib.contextmanager
    def execution_lock(self, execution: str, ns: str, *, timeout: float = 0.0
                       ) -> Iterator[None]:
        import psycopg

        what = f"execution {execution!r}/{ns!r} of {self.location}"
        key = int.from_bytes(lock_digest(execution, ns)[:8], "big", signed=True)
        try:  # its own session: the store's connection is shared by threads
            conn = psycopg.connect(self.url, autocommit=True, connect_timeout=10)
        except psycopg.Error as exc:
            raise CheckpointError(f"cannot lock {what}: {str(exc).strip()}") from None
        try:
            try:
                def try_once() -> bool:
                    row = conn.execute("SELECT pg_try_advisory_lock(%s)", (key,)).fetchone()
                    return row is not None and bool(row[0])

                _poll(try_once, timeout, what)
            except psycopg.Error as exc:
                raise CheckpointError(f"cannot lock {what}: {str(exc).strip()}") from None
            yield
        finally:
            conn.close()  # ends the session: the advisory lock goes with it

    def close(self) -> None:
        with self._lock:
            if self._pool is not None:
                self._pool.close()
                self._pool = None


def _redact(url: str) -> str:
    """``url`` without its password."""
    head, sep, tail = url.partition("://")
    if sep and "@" in tail:
        cred, _, host = tail.rpartition("@")
        user = cred.split(":", 1)[0]
        return f"{head}://{user}:***@{host}"
    return url


def open_row_store(where: str | Path) -> RowStore:
    """A row store from ``postgresql://...``, ``sqlite:///path``, ``s3://bucket/prefix``
    (:mod:`sealstream.agents._s3store`) or a plain file path."""
    text = str(where)
    if text.startswith(("postgresql://", "postgres://")):
        return PostgresRowStore(text)
    if text.startswith("sqlite:///"):
        return SqliteRowStore(Path(text[len("sqlite:///"):]))
    if text.lower().startswith("s3://"):
        from sealstream.agents._s3store import S3RowStore

        return S3RowStore(text)
    if "://" in text:
        raise CheckpointError(f"unsupported agent store URL {_redact(text)!r} "
                              "(use sqlite:///PATH, postgresql://... or s3://BUCKET/PREFIX)")
    return SqliteRowStore(Path(text))
