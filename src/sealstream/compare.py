"""Compare two result outputs window by window (``sealstream compare A B``).

An output is read back with its sink's own reading code: a JSON Lines or Parquet
results directory (its committed ``part-*`` files, as the sink lists them) or one
such file, a SQLite file's table or a PostgreSQL table. Each becomes one frame
(:class:`Results`): the window's identity (``__key``, the key's JSON text, or a
compound key's members ``"tenant":"a","user":7``; ``window_start``;
``window_end``) and each result field as its JSON text. A window emitted more than
once (updates within allowed lateness) counts with its last emission, as a database
table holds it.

Equality of one field of one window (:func:`compare`), columnar:

* the same text (after the JSON reading), or both null: equal;
* two integers: equal only when they are the same integer (no tolerance);
* two numbers otherwise (a float, or an exact decimal, which the JSON Lines output
  writes as a JSON string such as ``"104632.94"``): equal when
  ``|a - b| <= max(abs_tol, rel_tol * max(|a|, |b|))`` in binary floating point;
* anything else (strings, booleans, JSON values): equal only when the texts are.

Guaranteed: the report does not depend on the order of rows or files; its lists
are ordered by (key text, window_start, window_end, field). Raises
:class:`CompareInputError` (exit 2) for input that is not comparable results:
a missing path, a directory without committed results, a file or table that is
not sealstream's results, two outputs of different key shapes or fields.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from sealstream.errors import SinkError, SpecError
from sealstream.sinks._base import CommittedFile
from sealstream.sinks._files import json_value_text, read_own_file, split_json_fields
from sealstream.sources._parse import compound_key_text, json_str

__all__ = ["CompareInputError", "Comparison", "Results", "compare", "read_results"]

ID = ["__key", "window_start", "window_end"]
_TOKEN = "compare"
_SQLITE_MAGIC = b"SQLite format 3\x00"
_INT = r"^-?[0-9]+$"
_DECIMAL = r'^"-?[0-9]+(\.[0-9]+)?"$'


class CompareInputError(SpecError):
    """An input of ``sealstream compare`` is not comparable results (exit 2): say
    which and why, then give a results directory, file or table."""


@dataclass(frozen=True)
class Results:
    """One output read back: ``frame`` has :data:`ID` and one String column per
    field (its JSON text); ``key_fields`` is None for a single key."""

    where: str
    key_fields: tuple[str, ...] | None
    fields: tuple[str, ...]
    frame: pl.DataFrame


@dataclass(frozen=True)
class Comparison:
    """What :func:`compare` found: windows only in A, only in B (columns :data:`ID`)
    and the differing values (:data:`ID`, ``field``, ``a``, ``b``: JSON texts)."""

    a: Results
    b: Results
    only_a: pl.DataFrame
    only_b: pl.DataFrame
    differing: pl.DataFrame

    @property
    def equal(self) -> bool:
        return not (self.only_a.height or self.only_b.height or self.differing.height)

    @property
    def differing_windows(self) -> int:
        return self.differing.select(ID).n_unique() if self.differing.height else 0


# ------------------------------------------------------------------------------ reading
def read_results(target: str, table: str | None = None) -> Results:
    """Read the results at ``target``: a directory or file path, a ``sqlite:///`` URL,
    a ``postgresql://`` URL (``table`` names the table of a database)."""
    if target.startswith(("postgresql://", "postgres://")):
        from sealstream.checkpoint.stores import redact

        return _read_table("postgresql", target, _need_table(target, table), redact(target))
    if target.startswith("sqlite:"):
        from sealstream.checkpoint.stores import sqlite_path

        path = sqlite_path(target, Path.cwd())
        if not path.is_file():
            raise CompareInputError(f"{target}: no such SQLite file")
        return _read_table("sqlite", path, _need_table(target, table), str(path))
    if target.lower().startswith("s3://"):
        return _read_objects(target)
    path = Path(target)
    if not path.exists():
        raise CompareInputError(f"{target}: no such file or directory")
    if path.is_file() and _is_sqlite(path):
        return _read_table("sqlite", path, _need_table(target, table), str(path))
    if table is not None:
        raise CompareInputError(f"{target}: a table is given but it is not a SQLite file "
                                "nor a PostgreSQL URL")
    try:
        if path.is_dir():
            return _read_dir(path)
        if path.suffix == ".jsonl":
            return _read_jsonl([path], str(path))
        if path.suffix == ".parquet":
            return _read_parquet([path], str(path))
    except SinkError as exc:
        raise CompareInputError(str(exc)) from None
    raise CompareInputError(f"{target}: not results (expected a results directory, a "
                            ".jsonl or .parquet file, a SQLite file or a PostgreSQL URL)")


def _need_table(target: str, table: str | None) -> str:
    if table is None:
        raise CompareInputError(f"{target}: a database needs a table (--table)")
    return table


def _is_sqlite(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(len(_SQLITE_MAGIC)) == _SQLITE_MAGIC
    except OSError:
        return False


def _read_dir(path: Path) -> Results:
    from sealstream.sinks.jsonl import JsonlDirSink
    from sealstream.sinks.parquet import ParquetDirSink

    listed = {kind: sink.committed() for kind, sink in
              (("jsonl", JsonlDirSink(path, "results", _TOKEN)),
               ("parquet", ParquetDirSink(path, "results", _TOKEN)))}
    if listed["jsonl"] and listed["parquet"]:
        raise CompareInputError(f"{path}: holds both JSON Lines and Parquet results; "
                                "compare one output at a time")
    kind = "jsonl" if listed["jsonl"] else "parquet"
    files = _paths(path, listed[kind])
    if not files:
        raise CompareInputError(f"{path}: no committed results (part-*.jsonl or "
                                "part-*.parquet) in this directory")
    return _read_jsonl(files, str(path)) if kind == "jsonl" else _read_parquet(files, str(path))


def _read_objects(url: str) -> Results:
    """The committed results at ``s3://bucket/prefix`` (endpoint: ``AWS_ENDPOINT_URL``),
    listed and read as the S3 sinks do (see :mod:`sealstream.sinks.objects`)."""
    from sealstream._objects import ObjectStoreError, open_objects
    from sealstream.sinks.objects import JsonlObjectSink, ParquetObjectSink

    try:
        objects = open_objects(url)
        listed = {kind: sink.committed() for kind, sink in
                  (("jsonl", JsonlObjectSink(objects, "results", _TOKEN)),
                   ("parquet", ParquetObjectSink(objects, "results", _TOKEN)))}
    except (ObjectStoreError, SinkError) as exc:
        raise CompareInputError(f"{url}: {exc}") from None
    if listed["jsonl"] and listed["parquet"]:
        raise CompareInputError(f"{url}: holds both JSON Lines and Parquet results; "
                                "compare one output at a time")
    kind = "jsonl" if listed["jsonl"] else "parquet"
    if not listed[kind]:
        raise CompareInputError(f"{url}: no committed results (part-*.jsonl or "
                                "part-*.parquet) under this prefix")

    def files() -> Iterator[tuple[Path | str, bytes]]:
        for f in listed[kind]:
            where = f"{objects.location}/{f.token}"
            try:
                data = objects.get(f.token)
            except ObjectStoreError as exc:
                raise CompareInputError(str(exc)) from None
            if data is None:
                raise CompareInputError(f"{where}: vanished while being read")
            yield where, data

    try:
        return _jsonl_of(files(), url) if kind == "jsonl" else _parquet_of(files(), url)
    except SinkError as exc:
        raise CompareInputError(str(exc)) from None


def _paths(path: Path, files: list[CommittedFile]) -> list[Path]:
    return [(Path(f.location) if f.location else path) / f.token for f in files]


def _shape(columns: list[str], where: object) -> tuple[tuple[str, ...] | None, tuple[str, ...]]:
    """(key fields or None, value fields) of a results layout: the key's columns come
    before ``window_start``, the values after ``window_end``."""
    if "window_start" not in columns or "window_end" not in columns:
        raise CompareInputError(f"{where}: not results (no window_start and window_end)")
    start, end = columns.index("window_start"), columns.index("window_end")
    key = tuple(columns[:start])
    fields = tuple(c for c in columns[end + 1:] if not c.startswith("__"))
    if not key:
        raise CompareInputError(f"{where}: not results (no key before window_start)")
    return (None if key == ("key",) else key), fields


def _key_text(ids: pl.DataFrame, key_fields: tuple[str, ...] | None) -> pl.Expr:
    if key_fields is not None:
        return pl.col("key")
    return pl.when(pl.col("__kint")).then(pl.col("key")).otherwise(json_str(pl.col("key")))


def _read_jsonl(paths: list[Path], where: str) -> Results:
    return _jsonl_of(((p, read_own_file(p, "results")) for p in paths), where)


def _jsonl_of(files: Iterable[tuple[Path | str, bytes]], where: str) -> Results:
    from sealstream.sinks.jsonl import result_ids

    shape: tuple[tuple[str, ...] | None, tuple[str, ...]] | None = None
    frames = []
    for path, data in files:
        if not data.strip():
            continue
        if shape is None:
            first = data.lstrip().split(b"\n", 1)[0]
            try:
                line = json.loads(first)
            except ValueError:
                raise CompareInputError(f"{path}: not results (line 1 is not JSON)") from None
            if not isinstance(line, dict):
                raise CompareInputError(f"{path}: not results (line 1 is not a JSON object)")
            shape = _shape(list(line), path)
        key_fields, fields = shape
        ids = result_ids(data, path, key_fields)
        frames.append(pl.DataFrame([
            ids.select(_key_text(ids, key_fields).alias("__key")).to_series(),
            ids.get_column("window_start"), ids.get_column("window_end"),
            *_json_values(data, fields)]))
    if shape is None:
        raise CompareInputError(f"{where}: no result lines")
    return _results(where, shape, frames)


def _json_values(data: bytes, fields: tuple[str, ...]) -> list[pl.Series]:
    """Each field of the JSON Lines ``data`` as JSON texts. Fast path: one typed read
    (plus an integer read of the float columns, so that an integer in a float column
    keeps its exact digits); a field whose values mix strings and numbers (or hold
    anything else) goes through the sinks' :func:`split_json_fields`."""
    if not fields:
        return []
    plain = (pl.Int64, pl.Float64, pl.String, pl.Boolean, pl.Null)
    try:
        typed = pl.read_ndjson(data, infer_schema_length=None)
    except pl.exceptions.PolarsError:
        typed = None
    if typed is None or any(f in typed.columns and typed.schema[f] not in plain
                            for f in fields):
        return [part.select(json_value_text(pl.col("kind"), pl.col("text")).alias(f)).to_series()
                for f, part in zip(fields, split_json_fields(data, fields), strict=True)]
    typed = typed.with_columns(pl.lit(None, dtype=pl.String).alias(f)
                               for f in fields if f not in typed.columns)
    floats = [f for f in fields if typed.schema[f] == pl.Float64]
    ints = (pl.read_ndjson(data, schema={f: pl.Int64 for f in floats}, ignore_errors=True)
            if floats else pl.DataFrame())
    exprs = []
    for f in fields:
        c, dtype = pl.col(f), typed.schema[f]
        if dtype == pl.String:
            exprs.append(json_str(c).alias(f))
        elif dtype == pl.Boolean:
            exprs.append(_typed_text(f, dtype))
        elif f in floats:
            exprs.append(pl.coalesce(pl.lit(ints.get_column(f)).cast(pl.String),
                                     c.cast(pl.String)).alias(f))
        else:
            exprs.append(c.cast(pl.String).alias(f))
    return typed.select(exprs).get_columns()


def _read_parquet(paths: list[Path], where: str) -> Results:
    return _parquet_of(((p, read_own_file(p, "results")) for p in paths), where)


def _parquet_of(files: Iterable[tuple[Path | str, bytes]], where: str) -> Results:
    from sealstream.sinks.parquet import results_file_ids

    shape: tuple[tuple[str, ...] | None, tuple[str, ...]] | None = None
    frames = []
    for path, data in files:
        try:
            df = pl.read_parquet(data)
        except pl.exceptions.PolarsError:
            raise CompareInputError(f"{path}: not a Parquet file of results") from None
        file_shape = _shape(df.columns, path)
        if shape is None:
            shape = file_shape
        elif file_shape != shape:
            raise CompareInputError(f"{path}: its columns differ from the other files' "
                                    f"({', '.join(df.columns)})")
        key_fields, fields = shape
        ids = results_file_ids(path, data, key_fields)
        frames.append(pl.DataFrame([
            ids.select(_key_text(ids, key_fields).alias("__key")).to_series(),
            ids.get_column("window_start"), ids.get_column("window_end"),
            *(df.select(_typed_text(f, df.schema[f])).to_series() for f in fields)]))
    assert shape is not None
    return _results(where, shape, frames)


def _typed_text(name: str, dtype: pl.DataType) -> pl.Expr:
    """A typed column's values as JSON texts (a String column already holds JSON)."""
    c = pl.col(name)
    if dtype == pl.Boolean:
        return pl.when(c).then(pl.lit("true")).when(~c).then(pl.lit("false")).alias(name)
    return c.cast(pl.String).alias(name)


def _read_table(dialect: str, target: str | Path, table: str, shown: str) -> Results:
    from sealstream.sinks.database import KEY_TYPES, DatabaseSink

    try:
        sink = DatabaseSink(dialect, target, table, {}, _TOKEN, shown=shown)
    except SinkError as exc:
        raise CompareInputError(str(exc)) from None
    got = sink.read_table()
    sink.close()
    where = f"table {table!r} in {shown}"
    if got is None:
        raise CompareInputError(f"{where}: no such table")
    primary, rows = got
    columns = list(rows.columns)
    if primary == ("key", "key_is_int", "window_start", "window_end"):
        key_fields: tuple[str, ...] | None = None
        key = (pl.when(pl.col("key_is_int").is_in(["true", "1"])).then(pl.col("key"))
               .otherwise(json_str(pl.col("key"))))
    elif len(primary) > 3 and primary[-3:] == (KEY_TYPES, "window_start", "window_end"):
        key_fields = primary[:-3]
        key = compound_key_text(key_fields, [
            json_value_text(pl.col(KEY_TYPES).str.slice(n, 1), pl.col(f))
            for n, f in enumerate(key_fields)])
    else:
        raise CompareInputError(f"{where}: not a results table of sealstream (its primary "
                                f"key is ({', '.join(primary)}))")
    fields = tuple(c for c in columns if c not in primary)
    try:
        frame = rows.select(key.alias("__key"),
                            pl.col("window_start").cast(pl.Int64),
                            pl.col("window_end").cast(pl.Int64),
                            *(pl.col(f) for f in fields))
    except pl.exceptions.PolarsError:
        raise CompareInputError(f"{where}: its window columns are not integers") from None
    return _results(where, (key_fields, fields), [frame])


def _results(where: str, shape: tuple[tuple[str, ...] | None, tuple[str, ...]],
             frames: list[pl.DataFrame]) -> Results:
    key_fields, fields = shape
    schema = {"__key": pl.String, "window_start": pl.Int64, "window_end": pl.Int64,
              **{f: pl.String for f in fields}}
    frame = pl.concat([pl.DataFrame(schema=schema),
                       *(f.select(pl.col(c).cast(t) for c, t in schema.items())
                         for f in frames)])
    # a window emitted again (allowed lateness) holds its last emission, as a table does
    frame = frame.unique(subset=ID, keep="last", maintain_order=True)
    return Results(where, key_fields, fields, frame)


# ------------------------------------------------------------------------------ comparing
def compare(a: Results, b: Results, *, rel_tol: float = 1e-9,
            abs_tol: float = 0.0) -> Comparison:
    """Compare ``a`` with ``b`` window by window and field by field (see the module
    docstring). Raises :class:`CompareInputError` when their keys or fields differ."""
    if a.key_fields != b.key_fields:
        raise CompareInputError(f"different key shapes: {a.where} has {_key_name(a)}, "
                                f"{b.where} has {_key_name(b)}")
    if set(a.fields) != set(b.fields):
        raise CompareInputError(
            f"different result fields: {a.where} has {', '.join(a.fields) or 'none'}, "
            f"{b.where} has {', '.join(b.fields) or 'none'}")
    fields = a.fields
    left = a.frame.with_columns(pl.lit(True).alias("__in_a"))
    right = b.frame.rename({f: f"{f}__b" for f in fields}).with_columns(
        pl.lit(True).alias("__in_b"))
    joined = left.join(right, on=ID, how="full", coalesce=True, nulls_equal=True)
    order = [*ID]
    only_a = joined.filter(pl.col("__in_b").is_null()).select(ID).sort(order)
    only_b = joined.filter(pl.col("__in_a").is_null()).select(ID).sort(order)
    both = joined.filter(pl.col("__in_a") & pl.col("__in_b"))
    diffs = [both.filter(~_equal(pl.col(f), pl.col(f"{f}__b"), rel_tol, abs_tol))
             .select(*ID, pl.lit(f).alias("field"), pl.col(f).alias("a"),
                     pl.col(f"{f}__b").alias("b")) for f in fields]
    differing = pl.concat([pl.DataFrame(schema={"__key": pl.String, "window_start": pl.Int64,
                                                "window_end": pl.Int64, "field": pl.String,
                                                "a": pl.String, "b": pl.String}), *diffs])
    return Comparison(a, b, only_a, only_b, differing.sort([*order, "field"]))


def _key_name(r: Results) -> str:
    return "a single key" if r.key_fields is None else f"the key ({', '.join(r.key_fields)})"


def _number(text: pl.Expr) -> pl.Expr:
    """The value of a JSON number, or of a JSON string holding a decimal number."""
    unquoted = pl.when(text.str.contains(_DECIMAL)).then(text.str.strip_chars('"')
                                                          ).otherwise(text)
    return unquoted.cast(pl.Float64, strict=False)


def _plain(text: pl.Expr) -> pl.Expr:
    """A decimal number written as a JSON string (``"12.50"``) as the number's text."""
    return pl.when(text.str.contains(_DECIMAL)).then(text.str.strip_chars('"')).otherwise(text)


def _equal(a: pl.Expr, b: pl.Expr, rel_tol: float, abs_tol: float) -> pl.Expr:
    same = (_plain(a) == _plain(b)).fill_null(False) | (a.is_null() & b.is_null())
    both_int = a.str.contains(_INT).fill_null(False) & b.str.contains(_INT).fill_null(False)
    x, y = _number(a), _number(b)
    bound = pl.max_horizontal(pl.lit(abs_tol), rel_tol * pl.max_horizontal(x.abs(), y.abs()))
    close = ((x - y).abs() <= bound) | (x == y)  # x == y: equal infinities
    return same | (~both_int & close.fill_null(False))
