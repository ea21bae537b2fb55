"""Window results upserted into a SQLite or PostgreSQL table.

Selected in the spec::

    [sink]
    kind = "sqlite"                       # or "postgresql"
    url = "sqlite:///results.db"          # or "postgresql://user@host/db"
    table = "page_views"

The table (created if absent) has one row per result, identified by
``(key, key_is_int, window_start, window_end)``, its primary key::

    key           TEXT     the key as text (integers in decimal)
    key_is_int    BOOLEAN  whether the key was an integer (1 and "1" are two keys)
    window_start  BIGINT
    window_end    BIGINT
    <aggregate>   count: BIGINT; mean: DOUBLE PRECISION; sum, min, max: NUMERIC
                  (exact integers of any size, and floats); first, last: JSONB in
                  PostgreSQL, JSON text in SQLite (the value as in the JSON output);
                  sum, min, max, mean of a decimal field: NUMERIC in PostgreSQL,
                  TEXT in SQLite, the exact decimal text ("12.50")

**A compound key** (``key = ["tenant", "user"]``, :attr:`DatabaseSink.key_fields`)
replaces ``key`` and ``key_is_int`` by one column per field, under the field's
name, in the key's order, and ``key_types``::

    tenant, user  TEXT     each field's value as text (strings unquoted, numbers and
                           booleans as in the JSON output: 7, 2.5, true)
    key_types     TEXT     one letter per field, in order: s string, i integer,
                           f float, b boolean ("si": tenant a string, user an integer)
    window_start, window_end, <aggregates> as above

The primary key is ``(tenant, user, key_types, window_start, window_end)``:
``key_types`` tells the integer ``7`` from the string ``"7"`` (two keys in
sealstream), as ``key_is_int`` does for a single key.

An existing table must have these columns with fitting types and this primary
key, else the run stops with one line naming the table and what does not fit (a
table of a single key for a compound one, or of other key fields, is refused, never
written into).

Exactly once, two ways:

* **Transactional** (the checkpoint store is the same database): the epoch's
  rows are upserted inside the very transaction that publishes the checkpoint's
  manifest (:meth:`DatabaseSink.commit_in`). The results and the checkpoint
  become durable together or not at all; nothing is staged.
* **Idempotent** (any other store, or no checkpoints): ``prepare`` stages the
  epoch's rows durably in ``sealstream_sink_staging`` (one Arrow IPC blob per
  epoch); ``commit`` upserts them, records the commit and deletes the staging
  row in one transaction. A commit is recorded once; committing again does
  nothing, and the upsert by id makes even a repeated write harmless.

Either way ``sealstream_sink_commits`` records each committed unit (table,
token, epoch, and the ids of its rows as Arrow IPC) so the engine can read back
what was committed after an older checkpoint (:meth:`read_ids`).

One table, one pipeline (**choice**): ``sealstream_sink_owners`` records which
pipeline a results table belongs to (claimed by the first run that uses it, or
that creates it). Another pipeline's run is refused at start, before it touches
anything, with a message naming the table and its owner: two pipelines upserting
the same ``(key, window)`` rows would overwrite each other's results. Staged rows
carry their pipeline too, and a run only ever drops its own pipeline's staging.

PostgreSQL connection faults are retried like the checkpoint store's
(:func:`sealstream.checkpoint.stores.postgres.retry_seconds`): connecting, and a lost
connection under staging, committing (recorded once: repeating it is harmless)
and reading back.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import re
import sqlite3
import weakref
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import polars as pl
import pyarrow as pa
import pyarrow.ipc as ipc

from sealstream.errors import SinkError
from sealstream.sinks._base import JSON_LINE, CommittedFile, Sink, SinkRole
from sealstream.sinks._files import (
    check_epoch,
    check_run_token,
    id_schema,
    split_compound_key,
)

__all__ = ["DatabaseSink", "column_types", "same_database"]

ID_COLUMNS = ("key", "key_is_int", "window_start", "window_end")
#: the column of a compound key's table telling each field's kind (see KEY_KINDS)
KEY_TYPES = "key_types"
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")

#: aggregate function -> (PostgreSQL type, SQLite type)
_TYPES: dict[str, tuple[str, str]] = {
    "count": ("BIGINT", "INTEGER"),
    "mean": ("DOUBLE PRECISION", "REAL"),
    "sum": ("NUMERIC", "NUMERIC"),
    "min": ("NUMERIC", "NUMERIC"),
    "max": ("NUMERIC", "NUMERIC"),
    "first": ("JSONB", "TEXT"),
    "last": ("JSONB", "TEXT"),
    # sum, min, max, mean of a decimal field: its exact text ("12.50"); SQLite's
    # NUMERIC affinity would turn it into a binary float, so TEXT there
    "decimal": ("NUMERIC", "TEXT"),
}
#: types an existing column may have for each declared type (lower case, as the
#: databases report them)
_FITS: dict[str, set[str]] = {
    "BIGINT": {"bigint", "integer", "numeric", "int", "int8"},
    "INTEGER": {"integer", "int", "bigint", "numeric", ""},
    "DOUBLE PRECISION": {"double precision", "numeric", "real"},
    "REAL": {"real", "double", "float", "numeric", ""},
    "NUMERIC": {"numeric", ""},
    "JSONB": {"jsonb", "json", "text"},
    "TEXT": {"text", "json", ""},
    "BOOLEAN": {"boolean", "bool", "integer"},
}

STAGING = "sealstream_sink_staging"
COMMITS = "sealstream_sink_commits"
OWNERS = "sealstream_sink_owners"

T = TypeVar("T")


def id_columns(key_fields: tuple[str, ...] | None) -> tuple[str, ...]:
    """The primary key of the results table: :data:`ID_COLUMNS` for a single key, the
    fields, ``key_types``, ``window_start`` and ``window_end`` for a compound one."""
    if key_fields is None:
        return ID_COLUMNS
    return (*key_fields, KEY_TYPES, "window_start", "window_end")


def column_types(aggregates: dict[str, str], dialect: str,
                 key_fields: tuple[str, ...] | None = None) -> dict[str, str]:
    """Column -> SQL type of the results table, for ``{name: function}``."""
    i = 0 if dialect == "postgresql" else 1
    cols: dict[str, str]
    if key_fields is None:
        cols = {"key": "TEXT", "key_is_int": "BOOLEAN" if i == 0 else "INTEGER"}
    else:
        cols = {f: "TEXT" for f in key_fields}
        cols[KEY_TYPES] = "TEXT"
    cols["window_start"] = "BIGINT" if i == 0 else "INTEGER"
    cols["window_end"] = "BIGINT" if i == 0 else "INTEGER"
    for name, func in aggregates.items():
        cols[name] = _TYPES[func][i]
    return cols


def _col(name: str) -> str:
    """A column name quoted for SQL (a double quote in it doubled)."""
    return '"' + name.replace('"', '""') + '"'


def _pg_identity(url: str) -> tuple[Any, ...]:
    from psycopg.conninfo import conninfo_to_dict

    d = conninfo_to_dict(url)
    return (d.get("host") or "localhost", str(d.get("port") or 5432), d.get("dbname"),
            d.get("user"))


def same_database(sink: DatabaseSink, store: Any) -> bool:
    """Whether checkpoint ``store`` lives in ``sink``'s database, so the sink can
    commit inside the store's publishing transaction."""
    from sealstream.checkpoint.stores.postgres import PostgresCheckpointStore
    from sealstream.checkpoint.stores.sqlite import SqliteCheckpointStore

    if sink.dialect == "sqlite" and isinstance(store, SqliteCheckpointStore):
        return Path(sink.target).resolve() == Path(store.root).resolve()
    if sink.dialect == "postgresql" and isinstance(store, PostgresCheckpointStore):
        try:
            return _pg_identity(str(sink.target)) == _pg_identity(store.url)
        except Exception:  # noqa: BLE001 - an unparsable URL is not the same database
            return False
    return False


def _ipc(table: pa.Table) -> bytes:
    sink = io.BytesIO()
    with ipc.new_stream(sink, table.schema,
                        options=ipc.IpcWriteOptions(compression="zstd")) as w:
        w.write_table(table)
    return sink.getvalue()


def _unipc(data: bytes) -> pl.DataFrame:
    with ipc.open_stream(pa.py_buffer(data)) as r:
        out = pl.from_arrow(r.read_all())
    assert isinstance(out, pl.DataFrame)
    return out


def _numeric(v: Any) -> Any:
    """A sum/min/max value as the database gets it: exact text for PostgreSQL's
    NUMERIC (which takes 'NaN' and 'Infinity')."""
    if v is None:
        return None
    if isinstance(v, float):
        if math.isnan(v):
            return "NaN"
        if math.isinf(v):
            return "Infinity" if v > 0 else "-Infinity"
        return repr(v)
    return str(int(v))


class DatabaseSink(Sink):
    """Results upserted into ``table`` of a SQLite file or a PostgreSQL database.

    ``aggregates`` maps each output column to its function (count, sum, ...).
    ``dialect`` is ``"sqlite"`` (``target`` a file path) or ``"postgresql"``
    (``target`` a connection URL). ``shown`` is how messages name the database
    (never a password).
    """

    def __init__(self, dialect: str, target: str | Path, table: str,
                 aggregates: dict[str, str], run_token: str, *, shown: str,
                 role: SinkRole = "results", pipeline: str | None = None) -> None:
        if role != "results":
            raise SinkError(f"a {dialect} output can only hold results, not {role}; "
                            'use kind = "jsonl" for late events and bad records')
        if dialect not in ("sqlite", "postgresql"):
            raise ValueError(f"unknown dialect {dialect!r}")
        parts = table.split(".")
        if not all(_IDENT.fullmatch(p) for p in parts) or len(parts) > (
                2 if dialect == "postgresql" else 1):
            raise SinkError(f"sink.table: {table!r} is not a valid table name "
                            "(letters, digits and _, not starting with a digit)")
        for name in aggregates:
            if name in ID_COLUMNS:
                raise SinkError(f"aggregates.{name}: the name is a column of the "
                                f"{table!r} table's id; rename the aggregate")
        self.role = role
        self.dialect = dialect
        self.target = target
        self.table = table
        self.shown = shown
        self.aggregates = dict(aggregates)
        self.run_token = check_run_token(run_token)
        self._key_fields: tuple[str, ...] | None = None
        self.id_columns: tuple[str, ...] = ID_COLUMNS
        self.columns = column_types(self.aggregates, dialect)
        self._conn: Any = None
        self._ready = False
        self._buffers: dict[int, list[pl.DataFrame]] = {}
        self._prepared: dict[str, pl.DataFrame] = {}  # token -> rows (transactional mode)
        #: set by the engine when the checkpoint store shares this database
        self.transactional = False
        #: the pipeline the table belongs to (set by the engine); None: no claim
        self.pipeline = pipeline

    @property
    def key_fields(self) -> tuple[str, ...] | None:
        """A compound key's fields (each a column of its own), or None for a single key
        (the ``key`` and ``key_is_int`` columns). Set before the table is first used;
        raises :class:`SinkError` for a field name the table cannot hold."""
        return self._key_fields

    @key_fields.setter
    def key_fields(self, fields: tuple[str, ...] | None) -> None:
        if self._ready:
            raise SinkError(f"table {self.table!r}: the key cannot change once it is set up")
        if fields is not None:
            fields = tuple(fields)
            self._check_field_names(fields)
        self._key_fields = fields
        self.id_columns = id_columns(fields)
        self.columns = column_types(self.aggregates, self.dialect, fields)

    def _check_field_names(self, fields: tuple[str, ...]) -> None:
        if not fields:
            raise SinkError("source.key: a compound key needs at least one field")
        taken = {"window_start": "a window column", "window_end": "a window column",
                 KEY_TYPES: "the column of the key fields' kinds",
                 **{a: "an aggregate" for a in self.aggregates}}
        # SQLite compares column names without case; PostgreSQL keeps 63 bytes of one
        fold = self.dialect == "sqlite"
        seen: dict[str, str] = {}
        for f in fields:
            if not isinstance(f, str) or not f or "\0" in f:
                raise SinkError(f"source.key: {f!r} cannot name a column of table "
                                f"{self.table!r}")
            if self.dialect == "postgresql" and len(f.encode()) > 63:
                raise SinkError(f"source.key: {f!r} is longer than the 63 bytes PostgreSQL "
                                f"allows a column name of table {self.table!r}; rename it "
                                "with [transform] fields")
            name = f.lower() if fold else f
            clash = taken.get(name) or next(
                (why for t, why in taken.items() if fold and t.lower() == name), None)
            if clash is None and name in seen:
                clash = f"key field {seen[name]!r}"
            if clash is not None:
                raise SinkError(f"source.key: field {f!r} would name the same column of "
                                f"table {self.table!r} as {clash}; rename it with "
                                "[transform] fields")
            seen[name] = f

    # ------------------------------------------------------------ connection
    @property
    def _ph(self) -> str:
        return "%s" if self.dialect == "postgresql" else "?"

    def _q(self, name: str) -> str:
        return ".".join(f'"{p}"' for p in name.split("."))

    def _error(self, what: str, exc: BaseException, more: str = "") -> SinkError:
        text = str(exc).strip().splitlines()
        reason = text[0] if text else type(exc).__name__
        return SinkError(f"cannot {what} table {self.table!r} in {self.shown}: {reason}{more}")

    def _retried(self, exc: BaseException, conn: Any = None) -> str:
        if self.dialect != "postgresql":
            return ""
        from sealstream.checkpoint.stores.postgres import retried_for, transient

        return retried_for() if transient(exc, conn) else ""

    def _retrying(self, fn: Callable[[Any, int], T]) -> T:
        """``fn(connection, attempt)``; for PostgreSQL, again on a new connection while
        the connection is lost, for ``retry_seconds()`` at most (``fn`` must be safe to
        repeat after a lost outcome; ``attempt`` > 0 says it is a repeat)."""
        if self.dialect != "postgresql":
            return fn(self._db(), 0)
        from sealstream.checkpoint.stores.postgres import reconnecting

        return reconnecting(self, fn, self.shown)

    def _db_errors(self) -> tuple[type[BaseException], ...]:
        if self.dialect == "sqlite":
            return (sqlite3.Error,)
        import psycopg

        return (psycopg.Error,)

    def _db(self) -> Any:
        if self._conn is None:
            conn: Any
            errors: tuple[type[BaseException], ...] = (OSError, *self._db_errors())
            try:
                if self.dialect == "sqlite":
                    path = Path(self.target)
                    path.parent.mkdir(parents=True, exist_ok=True)
                    conn = sqlite3.connect(path, isolation_level=None, timeout=30.0,
                                           check_same_thread=False)
                    conn.execute("PRAGMA journal_mode=WAL")
                    conn.execute("PRAGMA synchronous=FULL")
                    weakref.finalize(self, conn.close)
                else:
                    from sealstream.checkpoint.stores.postgres import connect_raw

                    conn = connect_raw(str(self.target), what=self.shown)
                    weakref.finalize(self, conn.close)
            except errors as exc:
                raise self._error("open the database of", exc, self._retried(exc)) from None
            self._conn = conn
        if not self._ready:
            self._ensure_tables(self._conn)
        return self._conn

    @contextlib.contextmanager
    def _transaction(self, conn: Any) -> Iterator[None]:
        if self.dialect == "postgresql":
            with conn.transaction():
                yield
            return
        from sealstream.checkpoint.stores.sqlite import immediate

        with immediate(conn):
            yield

    def _existing_columns(self, conn: Any, table: str | None = None) -> dict[str, str] | None:
        table = self.table if table is None else table
        if self.dialect == "sqlite":
            rows = conn.execute(f"PRAGMA table_info({self._q(table)})").fetchall()
            return {str(r[1]): str(r[2]).lower() for r in rows} or None
        schema, _, name = table.rpartition(".")
        rows = conn.execute(
            "SELECT column_name, data_type FROM information_schema.columns "
            "WHERE table_name = %s AND table_schema = "
            + ("%s" if schema else "current_schema()"),
            (name, schema) if schema else (name,)).fetchall()
        return {str(r[0]): str(r[1]).lower() for r in rows} or None

    def _ensure_tables(self, conn: Any) -> None:
        blob = "BYTEA" if self.dialect == "postgresql" else "BLOB"
        try:
            with self._transaction(conn):
                if self.dialect == "postgresql":  # first runs must not race on CREATE
                    conn.execute("SELECT pg_advisory_xact_lock(5470013)")
                existing = self._existing_columns(conn)
                if existing is None:
                    cols = ", ".join(f"{_col(c)} {t} NOT NULL" if c in self.id_columns
                                     else f"{_col(c)} {t}" for c, t in self.columns.items())
                    ids = ", ".join(_col(c) for c in self.id_columns)
                    conn.execute(f"CREATE TABLE {self._q(self.table)} ({cols}, "
                                 f"PRIMARY KEY ({ids}))")
                else:
                    self._check_fit(existing, self._primary_key(conn))
                conn.execute(f"CREATE TABLE IF NOT EXISTS {STAGING} (tbl TEXT NOT NULL, "
                             f"token TEXT NOT NULL, epoch BIGINT NOT NULL, data {blob} NOT NULL, "
                             "pipeline TEXT, PRIMARY KEY (tbl, token))")
                if "pipeline" not in (self._existing_columns(conn, STAGING) or {}):
                    # a staging table of an older version: its rows have no pipeline
                    conn.execute(f"ALTER TABLE {STAGING} ADD COLUMN pipeline TEXT")
                conn.execute(f"CREATE TABLE IF NOT EXISTS {COMMITS} (tbl TEXT NOT NULL, "
                             f"token TEXT NOT NULL, epoch BIGINT NOT NULL, ids {blob} NOT NULL, "
                             "PRIMARY KEY (tbl, token))")
                conn.execute(f"CREATE TABLE IF NOT EXISTS {OWNERS} (tbl TEXT PRIMARY KEY, "
                             "pipeline TEXT NOT NULL)")
                self._claim(conn, created=existing is None)
        except SinkError:
            raise
        except self._db_errors() as exc:
            raise self._error("create", exc) from None
        self._ready = True

    def _canonical(self, conn: Any) -> str:
        """The table's name as the owners table records it: ``schema.name`` in
        PostgreSQL (``t`` and ``public.t`` are one table), lower case in SQLite."""
        if self.dialect == "sqlite":
            return self.table.lower()
        row = conn.execute("SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n "
                           "ON n.oid = c.relnamespace WHERE c.oid = to_regclass(%s)",
                           (self._q(self.table),)).fetchone()
        return f"{row[0]}.{row[1]}" if row is not None else self.table

    def _claim(self, conn: Any, *, created: bool) -> None:
        """Record the table as this pipeline's, or refuse when it is another's (in the
        transaction that set the tables up). A table created just now is ours."""
        if self.pipeline is None:
            return
        ph, name = self._ph, self._canonical(conn)
        if created:
            conn.execute(f"DELETE FROM {OWNERS} WHERE tbl = {ph}", (name,))
        conn.execute(f"INSERT INTO {OWNERS} (tbl, pipeline) VALUES ({ph}, {ph}) "
                     "ON CONFLICT (tbl) DO NOTHING", (name, self.pipeline))
        owner = conn.execute(f"SELECT pipeline FROM {OWNERS} WHERE tbl = {ph}",
                             (name,)).fetchone()[0]
        if owner != self.pipeline:
            raise SinkError(
                f"table {self.table!r} in {self.shown} holds the results of pipeline "
                f"{owner!r}; pipeline {self.pipeline!r} cannot share it (both would upsert "
                "the same (key, window) rows): give this pipeline its own sink.table")

    def _primary_key(self, conn: Any) -> tuple[str, ...]:
        """The existing table's primary key columns, in order (empty when it has none)."""
        if self.dialect == "sqlite":
            rows = conn.execute(f"PRAGMA table_info({self._q(self.table)})").fetchall()
            return tuple(str(r[1]) for r in sorted((r for r in rows if r[5]),
                                                   key=lambda r: int(r[5])))
        rows = conn.execute(
            "SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid "
            "AND a.attnum = ANY(i.indkey) WHERE i.indrelid = to_regclass(%s) AND i.indisprimary "
            "ORDER BY array_position(i.indkey::int2[], a.attnum)",
            (self._q(self.table),)).fetchall()
        return tuple(str(r[0]) for r in rows)

    def _key_shape(self, columns: tuple[str, ...]) -> str:
        if columns == ID_COLUMNS:
            return "a single key (key, key_is_int, window_start, window_end)"
        if columns[-3:] == (KEY_TYPES, "window_start", "window_end") and len(columns) > 3:
            return f"the compound key ({', '.join(columns[:-3])})"
        return f"({', '.join(columns)})" if columns else "no primary key"

    def _check_fit(self, existing: dict[str, str], primary: tuple[str, ...]) -> None:
        def misfit(have: str) -> SinkError:
            return SinkError(
                f"table {self.table!r} in {self.shown} does not fit this pipeline: its "
                f"results are identified by {have}, this pipeline's by "
                f"{self._key_shape(self.id_columns)}; give this pipeline its own sink.table "
                "(or drop the table)")

        if any(c not in existing for c in self.id_columns):
            # a table of another key shape: say so rather than name one missing column
            raise misfit(self._key_shape(primary) if primary
                         else f"no primary key (its columns are {', '.join(existing)})")
        for col, want in self.columns.items():
            have = existing.get(col)
            if have is None:
                raise SinkError(
                    f"table {self.table!r} in {self.shown} does not fit this pipeline: "
                    f"it has no column {col!r} ({want}); its columns are "
                    f"{', '.join(existing)}")
            if have not in _FITS[want]:
                raise SinkError(
                    f"table {self.table!r} in {self.shown} does not fit this pipeline: "
                    f"column {col!r} is {have.upper()}, expected {want}")
        if primary and primary != self.id_columns:
            raise misfit(self._key_shape(primary))

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
            self._ready = False

    # ------------------------------------------------------------ rows
    def _rows(self, frame: pl.DataFrame) -> list[tuple[Any, ...]]:
        """The rows to upsert, in table column order. Aggregate values come from each
        row's JSON line, which is typed per row (the typed columns are typed per batch:
        an integer beside a float there is a float, and integers past int64 too)."""
        cols: list[Sequence[Any]]
        if self._key_fields is None:
            cols = [
                frame.get_column("key").cast(pl.String).to_list(),
                [bool(v) if self.dialect == "postgresql" else int(v)
                 for v in frame.get_column("__kint").to_list()],
            ]
        else:  # each field's text, then their kinds ("si")
            try:
                parts = split_compound_key(frame.get_column("key"), self._key_fields)
            except ValueError as exc:
                raise SinkError(f"cannot write results to table {self.table!r}: {exc}"
                                ) from None
            cols = [part.get_column("text").to_list() for part in parts]
            kinds = pl.DataFrame([part.get_column("kind").alias(f"k{n}")
                                  for n, part in enumerate(parts)])
            cols.append(kinds.select(pl.concat_str(pl.all())).to_series().to_list())
        cols += [frame.get_column("window_start").to_list(),
                 frame.get_column("window_end").to_list()]
        lines = [json.loads(t) for t in frame.get_column(JSON_LINE).to_list()]
        for name, func in self.aggregates.items():
            values = [line.get(name) for line in lines]
            if func in ("count", "mean", "decimal"):  # a decimal: its exact text
                cols.append(values)
            elif func in ("first", "last"):
                cols.append([None if v is None else json.dumps(v) for v in values])
            elif self.dialect == "postgresql":
                cols.append([_numeric(v) for v in values])
            else:  # SQLite: ints within int64 and floats as they are, bigger ints as text
                cols.append([v if not isinstance(v, int) or -2**63 <= v < 2**63 else str(v)
                             for v in values])
        return list(zip(*cols, strict=True))

    def _upsert(self, conn: Any, frame: pl.DataFrame) -> None:
        if not frame.height:
            return
        names = list(self.columns)
        ph = self._ph
        values = []
        for c in names:
            func = self.aggregates.get(c)
            if self.dialect == "postgresql" and func in ("sum", "min", "max"):
                values.append(f"CAST({ph} AS NUMERIC)")
            elif self.dialect == "postgresql" and func in ("first", "last"):
                values.append(f"CAST({ph} AS JSONB)")
            else:
                values.append(ph)
        quoted = ", ".join(_col(c) for c in names)
        ids = ", ".join(_col(c) for c in self.id_columns)
        sets = ", ".join(f"{_col(c)} = excluded.{_col(c)}" for c in names
                         if c not in self.id_columns)
        conflict = f"ON CONFLICT ({ids}) DO " + (f"UPDATE SET {sets}" if sets else "NOTHING")
        if self.dialect == "sqlite":
            conn.executemany(f"INSERT INTO {self._q(self.table)} ({quoted}) "
                             f"VALUES ({', '.join(values)}) {conflict}", self._rows(frame))
            return
        # PostgreSQL: COPY into a session-local table shaped like the target, then one
        # INSERT ... SELECT ... ON CONFLICT (an order of magnitude faster than row inserts)
        conn.execute(f"CREATE TEMP TABLE IF NOT EXISTS sealstream_upsert "
                     f"(LIKE {self._q(self.table)} INCLUDING DEFAULTS) ON COMMIT DELETE ROWS")
        with conn.cursor().copy(f"COPY sealstream_upsert ({quoted}) FROM STDIN") as copy:
            for row in self._rows(frame):
                copy.write_row(row)
        conn.execute(f"INSERT INTO {self._q(self.table)} ({quoted}) SELECT {quoted} "
                     f"FROM sealstream_upsert {conflict}")

    def _ids_blob(self, frame: pl.DataFrame) -> bytes:
        ids = frame.select(pl.col("key").cast(pl.String), pl.col("__kint"),
                           pl.col("window_start"), pl.col("window_end"))
        return _ipc(ids.to_arrow())

    # ------------------------------------------------------------ two phases
    def _token(self, epoch: int) -> str:
        return f"{epoch:012d}-{self.run_token}"

    def write(self, epoch: int, frame: pl.DataFrame) -> None:
        check_epoch(epoch)
        if frame.height:
            self._buffers.setdefault(epoch, []).append(frame)

    def _take(self, epoch: int) -> pl.DataFrame | None:
        frames = self._buffers.pop(epoch, [])
        if not frames:
            return None
        keep = ["key", "__kint", "window_start", "window_end", JSON_LINE]
        return pl.concat([f.select(keep) for f in frames])

    def prepare(self, epoch: int) -> list[str]:
        check_epoch(epoch)
        frame = self._take(epoch)
        if frame is None:
            return []
        token = self._token(epoch)
        if self.transactional:
            self._prepared[token] = frame  # committed inside the checkpoint's transaction
            return [token]
        ph = self._ph
        blob = _ipc(frame.to_arrow())

        def stage(conn: Any, attempt: int) -> None:
            conn.execute(f"INSERT INTO {STAGING} (tbl, token, epoch, data, pipeline) "
                         f"VALUES ({ph}, {ph}, {ph}, {ph}, {ph})"
                         # a repeat after a lost connection: the same row may be there
                         + (" ON CONFLICT (tbl, token) DO NOTHING" if attempt else ""),
                         (self.table, token, epoch, blob, self._owner))

        try:
            self._retrying(stage)
        except self._db_errors() as exc:
            raise self._error("stage rows for", exc, self._retried(exc, self._conn)) from None
        return [token]

    @property
    def _owner(self) -> str:
        return self.pipeline if self.pipeline is not None else ""

    def _is_committed(self, conn: Any, token: str) -> bool:
        ph = self._ph
        row = conn.execute(f"SELECT 1 FROM {COMMITS} WHERE tbl = {ph} AND token = {ph}",
                           (self.table, token)).fetchone()
        return row is not None

    def commit_in(self, conn: Any, epoch: int, tokens: list[str]) -> None:
        """Upsert ``tokens`` of ``epoch`` on ``conn``, inside the caller's open
        transaction (the checkpoint store's publish); idempotent."""
        ph = self._ph
        for token in tokens:
            if self._is_committed(conn, token):
                continue
            frame = self._prepared.get(token)
            if frame is None:
                row = conn.execute(f"SELECT data FROM {STAGING} WHERE tbl = {ph} "
                                   f"AND token = {ph}", (self.table, token)).fetchone()
                if row is None:
                    raise SinkError(
                        f"cannot commit results {token} to table {self.table!r} in "
                        f"{self.shown}: the staged rows are gone")
                frame = _unipc(bytes(row[0]))
            self._upsert(conn, frame)
            conn.execute(f"INSERT INTO {COMMITS} (tbl, token, epoch, ids) "
                         f"VALUES ({ph}, {ph}, {ph}, {ph})",
                         (self.table, token, epoch, self._ids_blob(frame)))
            conn.execute(f"DELETE FROM {STAGING} WHERE tbl = {ph} AND token = {ph}",
                         (self.table, token))

    def in_publish(self, epoch: int, tokens: list[str]) -> Callable[[Any], None]:
        """What the checkpoint store runs in its publishing transaction."""
        if not self._ready:  # tables are made at recover(), never inside this transaction
            raise SinkError(f"table {self.table!r} in {self.shown} was not set up")

        def run(conn: Any) -> None:
            self.commit_in(conn, epoch, tokens)
        return run

    def commit(self, epoch: int, tokens: list[str]) -> None:
        check_epoch(epoch)
        if not tokens:
            return
        def run(conn: Any, _attempt: int) -> None:
            with self._transaction(conn):  # recorded once: a repeat commits nothing twice
                self.commit_in(conn, epoch, tokens)

        try:
            self._retrying(run)
        except SinkError:
            raise
        except self._db_errors() as exc:
            raise self._error("commit results to", exc, self._retried(exc, self._conn)) from None
        for token in tokens:
            self._prepared.pop(token, None)

    def recover(self, prepared: dict[int, list[str]]) -> None:
        self._buffers.clear()
        self._prepared.clear()
        ph = self._ph
        for epoch, tokens in sorted(prepared.items()):
            def uncommitted(conn: Any, _attempt: int, tokens: list[str] = tokens) -> list[str]:
                return [t for t in tokens if not self._is_committed(conn, t)]

            try:
                pending = self._retrying(uncommitted)
            except self._db_errors() as exc:
                raise self._error("read the commits of", exc,
                                  self._retried(exc, self._conn)) from None
            if pending:
                self.commit(epoch, pending)
        try:  # only this pipeline's staging (rows of an older version have none)
            self._retrying(lambda conn, _a: conn.execute(
                f"DELETE FROM {STAGING} WHERE tbl = {ph} AND (pipeline = {ph} "
                "OR pipeline IS NULL)", (self.table, self._owner)))
        except self._db_errors() as exc:
            raise self._error("clear the staged rows of", exc,
                              self._retried(exc, self._conn)) from None

    def committed(self) -> list[CommittedFile]:
        ph = self._ph
        try:
            rows = self._retrying(lambda conn, _a: conn.execute(
                f"SELECT epoch, token FROM {COMMITS} WHERE tbl = {ph} "
                "ORDER BY epoch, token", (self.table,)).fetchall())
        except self._db_errors() as exc:
            raise self._error("read the commits of", exc,
                              self._retried(exc, self._conn)) from None
        return [CommittedFile(int(e), str(t)) for e, t in rows]

    def read_table(self) -> tuple[tuple[str, ...], pl.DataFrame] | None:
        """The table's primary key columns and every row, each column as text (an exact
        number as the database prints it, a PostgreSQL double with its shortest exact
        digits, a SQLite real with 17 significant digits, a JSON value as its text), in
        table column order; None when the table does not exist. Read only: nothing is
        created or claimed (for ``sealstream compare``)."""
        self._ready = True  # never set tables up: this sink only reads

        def text(name: str, sql_type: str) -> str:
            if self.dialect == "postgresql":
                return f"{_col(name)}::text"
            if sql_type in ("real", "numeric", "double", "float", ""):
                return (f"CASE typeof({_col(name)}) WHEN 'real' THEN printf('%!.17g', "
                        f"{_col(name)}) ELSE CAST({_col(name)} AS TEXT) END")
            return f"CAST({_col(name)} AS TEXT)"

        def read(conn: Any, _attempt: int) -> tuple[tuple[str, ...], pl.DataFrame] | None:
            existing = self._existing_columns(conn)
            if existing is None:
                return None
            select = ", ".join(text(c, t) for c, t in existing.items())
            rows = conn.execute(f"SELECT {select} FROM {self._q(self.table)}").fetchall()
            frame = pl.DataFrame(rows, schema={c: pl.String for c in existing}, orient="row")
            return self._primary_key(conn), frame

        try:
            return self._retrying(read)
        except self._db_errors() as exc:
            raise self._error("read", exc, self._retried(exc, self._conn)) from None

    def read_ids(self, files: list[CommittedFile]) -> pl.DataFrame:
        schema = id_schema(self.role)
        if not files:
            return pl.DataFrame(schema=schema)
        ph = self._ph

        def read(conn: Any, _attempt: int) -> list[pl.DataFrame]:
            out = []
            for f in files:
                row = conn.execute(f"SELECT ids FROM {COMMITS} WHERE tbl = {ph} "
                                   f"AND token = {ph}", (self.table, f.token)).fetchone()
                if row is not None:
                    out.append(_unipc(bytes(row[0])))
            return out

        try:
            frames = self._retrying(read)
        except self._db_errors() as exc:
            raise self._error("read the commits of", exc,
                              self._retried(exc, self._conn)) from None
        if not frames:
            return pl.DataFrame(schema=schema)
        return pl.concat(frames).select([pl.col(c).cast(t) for c, t in schema.items()])
