"""Loading a reference table, columnar, with the version that a checkpoint binds.

A table is read whole at the start of a run into one Polars frame:

* a file (``csv``, ``parquet``, ``jsonl``): its bytes are hashed (SHA-256), then
  parsed; the version is the hash of the bytes;
* a query (``sqlite``, ``postgresql``): its result set is the snapshot; the version
  is the SHA-256 of that snapshot in a canonical form (the column names and types,
  then the rows sorted by every column, as JSON lines), so the same rows in another
  order are the same version;
* a compacted Kafka topic (``kafka``): see :mod:`sealstream.enrich._changelog`.

Nothing here is trusted from a checkpoint: a checkpoint records versions, and a
resumed run compares them with the versions it loads now.
"""

from __future__ import annotations

import hashlib
import io
import sqlite3
import time
from dataclasses import dataclass
from typing import Any

import polars as pl

from sealstream.enrich._settings import Enrich
from sealstream.errors import SourceError, SourceUnavailableError, SpecError

PRESENT = "__present"
"""True on a table row; False on a changelog tombstone (the key deleted from then on)."""
VALID_FROM = "__vf"
"""The version's start, Int64 ms since the epoch (a versioned table only)."""


@dataclass(frozen=True)
class Table:
    """A loaded table: its rows, whether it is versioned (``VALID_FROM`` column is
    a changelog's record time or the spec's ``valid_from`` column), and its version."""

    settings: Enrich
    frame: pl.DataFrame
    #: what a checkpoint binds: ``sha256`` and ``rows`` (a changelog: ``positions`` too)
    version: dict[str, Any]
    #: a changelog: ``frame`` already has ``VALID_FROM`` and ``PRESENT`` columns
    versioned: bool = False


def snapshot_hash(frame: pl.DataFrame) -> str:
    """The SHA-256 of a result set in canonical form (schema, then sorted rows)."""
    h = hashlib.sha256()
    h.update(repr([(c, str(t)) for c, t in frame.schema.items()]).encode())
    if frame.height and frame.width:
        text = frame.sort(frame.columns, nulls_last=True).with_columns(
            pl.col(c).cast(pl.String) for c, t in frame.schema.items()
            if not (t.is_numeric() or t == pl.String or t == pl.Boolean or t == pl.Null)
        ).write_ndjson()
        h.update(text.encode())
    return h.hexdigest()


def load_table(e: Enrich) -> Table:
    """Read ``e``'s table now. SpecError (exit 2) when a file is absent or a query is
    not valid; SourceError (exit 1) when it cannot be parsed or read;
    SourceUnavailableError (exit 1) when its database cannot be reached within
    ``fail_after_ms``."""
    if e.kind in ("csv", "parquet", "jsonl"):
        return _file(e)
    if e.kind == "sqlite":
        return _sqlite(e)
    if e.kind == "postgresql":
        return _postgres(e)
    from sealstream.enrich._changelog import load_changelog

    return load_changelog(e)


def _file(e: Enrich) -> Table:
    path = e.resolved
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise SpecError(f"enrich.{e.name}.path: {path}: reference table not found") from None
    except OSError as exc:
        raise SourceError(f"enrich.{e.name}: {path}: cannot read the reference table "
                          f"({exc.strerror or exc})") from None
    try:
        if e.kind == "csv":
            # key columns as written (types inferred would turn "007" into 7)
            frame = pl.read_csv(io.BytesIO(data), infer_schema_length=None,
                                schema_overrides={c: pl.String for c in e.on})
        elif e.kind == "parquet":
            frame = pl.read_parquet(io.BytesIO(data))
        else:
            frame = (pl.read_ndjson(io.BytesIO(data), infer_schema_length=None)
                     if data.strip() else pl.DataFrame())
    except Exception as exc:  # noqa: BLE001 - any parser failure is the file's
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise SourceError(f"enrich.{e.name}: {path}: not a valid {e.kind} table "
                          f"({first})") from None
    return Table(e, frame, {"sha256": hashlib.sha256(data).hexdigest(),
                            "rows": frame.height})


def sqlite_path(e: Enrich) -> str:
    """The database file of a ``sqlite:///relative`` or ``sqlite:////absolute`` url."""
    assert e.url is not None
    if not e.url.startswith("sqlite:///"):
        raise SpecError(f"enrich.{e.name}.url: {e.url!r} is not a sqlite:///PATH url")
    rest = e.url[len("sqlite:///"):]
    return rest if rest.startswith("/") else str(e.base_dir / rest)


def _query_table(e: Enrich, frame: pl.DataFrame) -> Table:
    return Table(e, frame, {"sha256": snapshot_hash(frame), "rows": frame.height})


def _sqlite(e: Enrich) -> Table:
    path = sqlite_path(e)
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30.0)
    except sqlite3.Error:
        raise SpecError(f"enrich.{e.name}.url: {path}: database not found") from None
    try:
        assert e.query is not None
        frame = pl.read_database(e.query, conn, infer_schema_length=None)
    except sqlite3.OperationalError as exc:
        if "unable to open" in str(exc):
            raise SpecError(f"enrich.{e.name}.url: {path}: database not found") from None
        raise SpecError(f"enrich.{e.name}.query: the query fails: {exc}") from None
    except sqlite3.Error as exc:
        raise SpecError(f"enrich.{e.name}.query: the query fails: {exc}") from None
    finally:
        conn.close()
    return _query_table(e, frame)


def _address(url: str) -> str:
    """``host:port/db`` of a PostgreSQL url, without user or password."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    return f"{parts.hostname or 'localhost'}:{parts.port or 5432}{parts.path}"


def _postgres(e: Enrich) -> Table:
    import psycopg

    assert e.url is not None and e.query is not None
    deadline = time.monotonic() + e.fail_after_ms / 1000
    delay = 0.1
    while True:
        try:
            conn = psycopg.connect(e.url, connect_timeout=max(1, e.fail_after_ms // 1000))
            break
        except psycopg.OperationalError as exc:
            if time.monotonic() >= deadline:
                why = str(exc).strip().splitlines()[-1] if str(exc).strip() else "no answer"
                raise SourceUnavailableError(
                    f"enrich.{e.name}: the PostgreSQL server at {_address(e.url)} cannot be "
                    f"reached ({why}); gave up after {e.fail_after_ms} ms") from None
            time.sleep(delay)
            delay = min(2.0, delay * 2)
    try:
        with conn.cursor() as cur:
            cur.execute(e.query.encode())
            names = [d.name for d in cur.description or ()]
            rows = cur.fetchall()
        frame = pl.DataFrame(rows, schema=names, orient="row", infer_schema_length=None)
    except psycopg.OperationalError as exc:
        raise SourceError(f"enrich.{e.name}: the PostgreSQL server at {_address(e.url)} "
                          f"failed during the query ({str(exc).strip()})") from None
    except psycopg.Error as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise SpecError(f"enrich.{e.name}.query: the query fails: {first}") from None
    finally:
        conn.close()
    return _query_table(e, frame)
