"""The stores a console shows, opened for reading only.

Each ``STORE`` argument of ``sealstream console`` becomes one :class:`Source`: a
checkpoint directory, a SQLite file, a PostgreSQL database (one pipeline or several), an
S3 prefix (one pipeline) or an agent store. Opening never writes:

* a directory is only listed and read (no lock, no ``rejected/`` created);
* SQLite is opened ``mode=ro`` (no WAL switch, no schema, no migration);
* PostgreSQL sessions run with ``default_transaction_read_only = on``, so the server
  itself refuses any write;
* an S3 prefix is read through objects that refuse every write (no probe, no lease,
  no claim, no ``STORE`` created): :mod:`sealstream.console._objstores`.

Checkpoints moved aside as evidence (``rejected/`` in a directory, the
``sealstream_rejected`` table in a database) are read through an *evidence view*: a
store that shows the moved checkpoint under its own id, so that
:func:`sealstream.inspect.inspect_checkpoint` and the guard judge it exactly as they
judged it before it was moved.
"""

from __future__ import annotations

import os
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sealstream._objects import ObjectStoreError
from sealstream.checkpoint.stores import is_postgres, is_s3, is_url, redact, sqlite_path
from sealstream.checkpoint.stores.base import (
    PREFIX,
    REJECTED,
    CheckpointStore,
    _parse_id,
    checkpoint_dirname,
)
from sealstream.checkpoint.stores.directory import LocalCheckpointStore
from sealstream.checkpoint.stores.postgres import PostgresCheckpointStore
from sealstream.checkpoint.stores.sqlite import SqliteCheckpointStore
from sealstream.console import _objstores
from sealstream.errors import CheckpointError, SealstreamError

#: what a read failure of any store raises (shown on the page, never a server error)
READ_ERRORS: tuple[type[BaseException], ...] = (SealstreamError, OSError, sqlite3.Error,
                                                ValueError, ObjectStoreError)


@dataclass
class Aside:
    """One checkpoint moved aside as evidence."""

    id: int
    reason: str
    moved_at: str | None
    handle: str  # directory name under rejected/, or "reason|moved_at" in a database


@dataclass
class Pipeline:
    """One pipeline's checkpoints in a source."""

    source: Source
    name: str
    index: int

    def open(self) -> CheckpointStore:
        return self.source.open(self.name)

    def asides(self) -> list[Aside]:
        return self.source.asides(self.name)

    def open_aside(self, aside: Aside) -> CheckpointStore:
        return self.source.open_aside(self.name, aside)


@dataclass
class Source:
    """One STORE argument: where it is, what kind, its pipelines (or why it cannot be read)."""

    index: int
    where: str
    kind: str = "directory"  # directory | sqlite | postgresql | s3 | agents
    shown: str = ""
    error: str | None = None
    pipelines: list[Pipeline] = field(default_factory=list)

    # ---------------------------------------------------------------- discovery
    def discover(self) -> None:
        """Fill ``kind``, ``pipelines`` and ``error`` (never raises)."""
        from sealstream.cli._agents import is_agent_store

        self.shown = redact(self.where) if is_url(self.where) else str(self.where)
        self.error = None
        self.pipelines = []
        try:
            if is_s3(self.where):  # (the agent check through the store's shared client)
                if _objstores.s3_agent_store(self.where):
                    self.kind = "agents"
                    return
                self.kind = "s3"
                names = [_objstores.s3_pipeline(self.where)]
            elif is_url(self.where) or Path(self.where).is_file():
                if is_agent_store(self.where):
                    self.kind = "agents"
                    return
                names = self._db_pipelines()
            else:
                self.kind = "directory"
                root = Path(self.where)
                if not root.is_dir():
                    raise CheckpointError(f"checkpoint directory {root} does not exist")
                names = [_directory_pipeline(DirectoryStore(root))]
            self.pipelines = [Pipeline(self, n, i) for i, n in enumerate(names)]
        except READ_ERRORS as exc:
            self.error = redact(str(exc)) or type(exc).__name__

    def _db_pipelines(self) -> list[str]:
        if is_postgres(self.where):
            from sealstream.checkpoint.stores import postgres as pg_store

            self.kind = "postgresql"
            return pg_store.pipelines_in(_read_only_url(self.where), self.shown)
        from sealstream.checkpoint.stores import sqlite as sqlite_store

        self.kind = "sqlite"
        db = self._sqlite_file()
        if not db.is_file():
            raise CheckpointError(f"checkpoint database {self.shown} does not exist")
        return sqlite_store.pipelines_in(db)

    def _sqlite_file(self) -> Path:
        return sqlite_path(self.where) if is_url(self.where) else Path(self.where)

    # ---------------------------------------------------------------- opening
    def open(self, pipeline: str) -> CheckpointStore:
        if self.kind == "postgresql":
            return ReadOnlyPostgresStore(self.where, pipeline)
        if self.kind == "sqlite":
            return ReadOnlySqliteStore(self._sqlite_file(), pipeline)
        if self.kind == "s3":
            return _objstores.open_s3(self.where)
        return DirectoryStore(Path(self.where))

    def asides(self, pipeline: str) -> list[Aside]:
        """The checkpoints moved aside, oldest move first."""
        if self.kind == "s3":
            return _by_move([_aside(cid, name) for cid, name in
                             _objstores.s3_asides(self.where)])
        if self.kind == "directory":
            rej = Path(self.where) / REJECTED
            if not rej.is_dir():
                return []
            out = []
            for entry in sorted(rej.iterdir()):
                cid = _aside_id(entry.name)
                if cid is None or not entry.is_dir():
                    continue
                out.append(_aside(cid, entry.name))
            return _by_move(out)
        store = self.open(pipeline)
        try:
            rows = store.rejected()  # type: ignore[attr-defined]
        finally:
            store.close()
        return [Aside(int(r["id"]), str(r["reason"]), None if r["moved_at"] is None
                      else str(r["moved_at"]), f"{r['reason']}|{r['moved_at']}")
                for r in rows if isinstance(r.get("id"), int)]

    def open_aside(self, pipeline: str, aside: Aside) -> CheckpointStore:
        if self.kind == "directory":
            return AsideDirectoryStore(Path(self.where), aside)
        if self.kind == "s3":
            return _objstores.AsideObjectStore(self.where, aside)
        if self.kind == "sqlite":
            return AsideSqliteStore(self._sqlite_file(), pipeline, aside)
        return AsidePostgresStore(self.where, pipeline, aside)


def _aside_id(name: str) -> int | None:
    head = name[: len(PREFIX) + 12]
    if not head.startswith(PREFIX) or not head[len(PREFIX):].isdigit() or \
            len(name) <= len(head) or name[len(head)] != "-":
        return None
    return int(head[len(PREFIX):])


def _aside(cid: int, name: str) -> Aside:
    """The checkpoint moved aside as ``rejected/NAME`` (``cp-N-<reason>-<time>``)."""
    rest = name[len(checkpoint_dirname(cid)) + 1:]
    reason, _, stamp = rest.rpartition("-")
    return Aside(cid, reason or rest, stamp or None, name)


def _by_move(asides: list[Aside]) -> list[Aside]:
    return sorted(asides, key=lambda a: (a.moved_at or "", a.id))


def _directory_pipeline(store: LocalCheckpointStore) -> str:
    """A directory holds one pipeline: the name its newest readable manifest gives."""
    for cid in reversed(store.ids()):
        doc = store.read_manifest(cid)
        if doc is not None and isinstance(doc.get("pipeline"), str):
            return str(doc["pipeline"])
    return store.root.name or str(store.root)


def _read_only_url(url: str) -> str:
    """``url`` with sessions that refuse every write (``default_transaction_read_only``)."""
    sep = "&" if "?" in url else "?"
    return f"{url}{sep}options=-c%20default_transaction_read_only%3Don"


# --------------------------------------------------------------------------- read-only stores
def _ro_sqlite(db: Path) -> sqlite3.Connection:
    try:
        return sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30.0,
                               check_same_thread=False)
    except sqlite3.Error as exc:
        raise CheckpointError(f"cannot open checkpoint database {db}: {exc}") from None


class ReadOnlySqliteStore(SqliteCheckpointStore):
    """A SQLite checkpoint store opened ``mode=ro``: no WAL switch, no schema, no write."""

    def _db(self, create: bool = False) -> sqlite3.Connection | None:
        if create:
            raise CheckpointError("the console never writes to a store")
        if self._conn is None:
            if not self.root.is_file():
                return None
            self._conn = _ro_sqlite(self.root)
        conn: sqlite3.Connection = self._conn
        return conn


class ReadOnlyPostgresStore(PostgresCheckpointStore):
    """A PostgreSQL checkpoint store whose sessions refuse every write."""

    def __init__(self, url: str, pipeline: str) -> None:
        super().__init__(_read_only_url(url), pipeline, shown=redact(url))


class DirectoryStore(LocalCheckpointStore):
    """A checkpoint directory, its ids listed with one ``scandir`` (no ``stat`` per entry:
    10,000 checkpoints list in milliseconds)."""

    def ids(self) -> list[int]:
        try:
            with os.scandir(self.root) as entries:
                found = [(_parse_id(e.name), e) for e in entries]
                return sorted(cid for cid, e in found
                              if cid is not None and e.is_dir())
        except (FileNotFoundError, NotADirectoryError):
            return []


# --------------------------------------------------------------------------- evidence views
class AsideDirectoryStore(LocalCheckpointStore):
    """A checkpoint under ``rejected/`` shown under its own id; files it shares with
    older checkpoints (an incremental chain's base) are read where they still are."""

    def __init__(self, root: Path, aside: Aside) -> None:
        super().__init__(root)
        self.aside = aside
        self._dir = root / REJECTED / aside.handle
        self._own = f"{checkpoint_dirname(aside.id)}/"

    @property
    def location(self) -> str:
        return str(self._dir)

    def ids(self) -> list[int]:
        return [self.aside.id]

    def path_of(self, cid: int) -> Path:
        return self._dir if cid == self.aside.id else super().path_of(cid)

    def _path(self, rel: str) -> Path | None:
        if rel.startswith(self._own):
            rest = rel[len(self._own):]
            if not rest or "/" in rest or rest in (".", ".."):
                return None
            return self._dir / rest
        return super()._path(rel)

    def _names(self, cid: int) -> list[str]:
        d = self.path_of(cid)
        if not d.is_dir():
            return []
        prefix = checkpoint_dirname(cid)
        return sorted(f"{prefix}/{f.name}" for f in d.iterdir()
                      if f.is_file() and not f.name.startswith("."))


class _AsideRows(CheckpointStore):
    """What the SQLite and PostgreSQL aside views share: one checkpoint, the moved-aside
    one, whose files are the rows :meth:`_moved` selects (each database's own SQL)."""

    aside: Aside

    def _moved(self, rel: str | None) -> list[tuple[Any, ...]]:
        raise NotImplementedError

    def ids(self) -> list[int]:
        return [self.aside.id]

    def _raw(self, rel: str) -> bytes | None:
        rows = self._moved(rel)
        if rows:
            return bytes(rows[0][1]) if rows[0][1] is not None else b""
        return super()._raw(rel)  # type: ignore[safe-super]  # the store class after us in the MRO

    def _names(self, cid: int) -> list[str]:
        if cid != self.aside.id:
            return super()._names(cid)  # type: ignore[safe-super]
        return [str(r[0]) for r in self._moved(None)]


class AsideSqliteStore(_AsideRows, ReadOnlySqliteStore):
    """A checkpoint in ``sealstream_rejected`` shown under its own id."""

    def __init__(self, db: Path, pipeline: str, aside: Aside) -> None:
        super().__init__(db, pipeline)
        self.aside = aside

    def _moved(self, rel: str | None) -> list[tuple[Any, ...]]:
        reason, _, moved = self.aside.handle.partition("|")
        sql = ("SELECT name, CAST(data AS BLOB) FROM sealstream_rejected WHERE pipeline = ? "
               "AND id = ? AND reason = ? AND moved_at = ? AND name IS NOT NULL")
        args: list[Any] = [self.aside.id, reason, moved]
        if rel is not None:
            sql += " AND name = ?"
            args.append(rel)
        return self._query(sql + " ORDER BY name", *args)


class AsidePostgresStore(_AsideRows, ReadOnlyPostgresStore):
    """A checkpoint in ``sealstream_rejected`` shown under its own id."""

    def __init__(self, url: str, pipeline: str, aside: Aside) -> None:
        super().__init__(url, pipeline)
        self.aside = aside

    def _moved(self, rel: str | None) -> list[tuple[Any, ...]]:
        reason, _, moved = self.aside.handle.partition("|")
        sql = ("SELECT name, data FROM sealstream_rejected WHERE pipeline = %s AND id = %s "
               "AND reason = %s AND to_char(moved_at AT TIME ZONE 'UTC', "
               "'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"') = %s AND name IS NOT NULL")
        args: list[Any] = [self.aside.id, reason, moved]
        if rel is not None:
            sql += " AND name = %s"
            args.append(rel)
        return self._query(sql + " ORDER BY name", *args)


def discover(stores: list[str]) -> list[Source]:
    """One :class:`Source` per STORE argument, discovered."""
    out = []
    for i, where in enumerate(stores):
        s = Source(i, where)
        s.discover()
        out.append(s)
    return out
