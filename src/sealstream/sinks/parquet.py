"""A directory of Parquet files of window results, one file per epoch and run.

Layout of ``path`` (created with its parents when missing)::

    part-000000000007-a1b2c3.parquet              committed: readers glob *.parquet
    .part-000000000008-a1b2c3.parquet.inprogress  staged: ignored by readers

Only role ``"results"`` is supported (late events and bad records have no
fixed schema; write them as JSON Lines).

What a file holds: the typed columns of the written frames, in frame order,
without the internal ``__json`` and ``__kint`` columns: ``key``,
``window_start``, ``window_end`` (Int64) and one column per aggregate.

* ``key`` is Int64 when every key of the epoch is an integer that fits in
  Int64, else String. When an epoch mixes integer and string keys (or has an
  integer key beyond Int64), the file's key-value metadata
  ``sealstream.key_is_int`` records which rows hold integer keys (a base64
  bit-packed mask), so :meth:`ParquetDirSink.read_ids` restores ``__kint``.
* **Column types may differ between files.** Each file's types come from its
  own epoch: an aggregate can be Int64 in one file (a sum of integers) and
  Float64 in another (a sum that met a float), and ``key`` can be Int64 in one
  and String in another. Readers of the whole directory should read with a
  relaxed/union schema (e.g. ``pl.concat([...], how="diagonal_relaxed")``);
  :meth:`~ParquetDirSink.read_ids` reads file by file and normalises.
* Within one epoch, frames of several ``write`` calls are concatenated with
  relaxed types (Int64 + Float64 -> Float64; columns still conflicting become
  String).

**A compound key** (``key = ["tenant", "user"]``; :attr:`ParquetDirSink.key_fields`)
is written as one column per field, under the field's name, in the key's order,
instead of ``key``: ``tenant``, ``user``, ``window_start``, ``window_end``, then
the aggregates. A field's column has its values' own type in that file: Int64
when every value of the field in the epoch is an integer, Float64 when every one
is a float, Boolean, or String when every one is a string. A field whose values
mix kinds in one epoch (an integer beside a string, ``7`` beside ``7.0``: two keys
in sealstream) is a String column holding each value's JSON text (``7``,
``"7"``), and the file's key-value metadata ``sealstream.key_json_fields`` lists
such fields (a JSON array), so :meth:`ParquetDirSink.read_ids` restores the exact
identity. A result's identity is (its key fields..., ``window_start``,
``window_end``). A committed file of the directory that lacks the key's columns
(written for another key) stops the read-back with one line naming the file.

Rows of an epoch are kept in memory until ``prepare``, which writes, fsyncs
and closes the staging file and fsyncs the directory; ``commit`` renames it.
Every :class:`OSError` becomes a one-line :class:`~sealstream.errors.SinkError`
naming the path and the OS reason; a failed ``prepare`` deletes its staging
file, so a partial file is never published.
"""

from __future__ import annotations

import base64
import contextlib
import io
import os
from pathlib import Path

import numpy as np
import polars as pl

from sealstream.errors import SinkError
from sealstream.sinks._base import JSON_LINE, RESULT_ID_COLUMNS, CommittedFile, SinkRole
from sealstream.sinks._files import (
    StagedDirSink,
    check_epoch,
    fsync_dir,
    fsync_file,
    id_schema,
    json_value_text,
    os_reason,
    read_own_file,
    split_compound_key,
)
from sealstream.sources._parse import compound_key_text, json_text

__all__ = ["KEY_IS_INT_METADATA", "KEY_JSON_FIELDS_METADATA", "ParquetDirSink"]

KEY_IS_INT_METADATA = "sealstream.key_is_int"
KEY_JSON_FIELDS_METADATA = "sealstream.key_json_fields"
_KINT = "__kint"


def _concat(frames: list[pl.DataFrame]) -> pl.DataFrame:
    if len(frames) == 1:
        return frames[0]
    try:
        return pl.concat(frames, how="diagonal_relaxed")
    except pl.exceptions.PolarsError:
        dtypes: dict[str, set[pl.DataType]] = {}
        for f in frames:
            for name, dtype in f.schema.items():
                dtypes.setdefault(name, set()).add(dtype)
        conflicting = [n for n, ds in dtypes.items() if len(ds) > 1]
        as_text = [
            f.with_columns(pl.col(c).cast(pl.String) for c in conflicting if c in f.columns)
            for f in frames
        ]
        return pl.concat(as_text, how="diagonal_relaxed")


def _typed(df: pl.DataFrame) -> tuple[pl.DataFrame, dict[str, str]]:
    """Drop ``__kint``; type ``key``; return the frame and the file metadata."""
    kint = df.get_column(_KINT).fill_null(False)
    out = df.drop(_KINT).with_columns(pl.col("key").cast(pl.String))
    if bool(kint.all()):
        try:
            return out.with_columns(pl.col("key").cast(pl.Int64, strict=True)), {}
        except pl.exceptions.PolarsError:
            pass  # an integer beyond Int64: keep text, record the mask
    if not bool(kint.any()):
        return out, {}
    mask = np.packbits(kint.to_numpy().astype(np.bool_))
    return out, {KEY_IS_INT_METADATA: base64.b64encode(mask.tobytes()).decode("ascii")}


def _typed_compound(df: pl.DataFrame,
                    fields: tuple[str, ...]) -> tuple[pl.DataFrame, dict[str, str]]:
    """Replace ``key``/``__kint`` by one typed column per key field (first, in key
    order); return the frame and the file metadata (see the module docstring)."""
    import json

    try:
        parts = split_compound_key(df.get_column("key"), fields)
    except ValueError as exc:
        raise SinkError(f"cannot write results as Parquet: {exc}") from None
    columns: list[pl.Series] = []
    as_json: list[str] = []
    for f, part in zip(fields, parts, strict=True):
        kinds = set(part.get_column("kind").unique().to_list())
        if len(kinds) == 1:  # the typed column of that kind ("s", "i", "f" or "b")
            columns.append(part.get_column(kinds.pop()).alias(f))
        else:  # mixed kinds: each value's JSON text
            as_json.append(f)
            columns.append(part.select(
                json_value_text(pl.col("kind"), pl.col("text")).alias(f)).to_series())
    rest = df.drop(["key", _KINT])
    out = pl.DataFrame(columns).hstack(rest) if columns else rest
    meta = {KEY_JSON_FIELDS_METADATA: json.dumps(as_json)} if as_json else {}
    return out, meta


def _compound_ids(df: pl.DataFrame, meta: dict[str, str], fields: tuple[str, ...],
                  where: Path | str) -> pl.DataFrame:
    """The identity frame of a file written with a compound key."""
    import json

    try:
        as_json = set(json.loads(meta.get(KEY_JSON_FIELDS_METADATA, "[]")))
    except ValueError:
        raise SinkError(f"cannot read results from {where}: bad "
                        f"{KEY_JSON_FIELDS_METADATA}") from None
    values: list[pl.Expr] = []
    for f in fields:
        c, dtype = pl.col(f), df.schema[f]
        value = c if f in as_json and dtype == pl.String else json_text(c, dtype)
        if value is None:
            raise SinkError(f"cannot read results from {where}: its key column {f!r} has a "
                            "type sealstream does not write")
        values.append(value)
    ids = df.select(compound_key_text(fields, values).alias("key"),
                    pl.lit(False).alias(_KINT), "window_start", "window_end")
    if ids.get_column("key").null_count():
        raise SinkError(f"cannot read results from {where}: a key column holds a null")
    return ids


def _kint_from(meta: dict[str, str], height: int, where: Path | str) -> pl.Series:
    encoded = meta.get(KEY_IS_INT_METADATA)
    if encoded is None:
        return pl.Series("__kint", np.zeros(height, dtype=np.bool_))
    try:
        bits = np.unpackbits(np.frombuffer(base64.b64decode(encoded), dtype=np.uint8))
    except ValueError:
        raise SinkError(f"cannot read results from {where}: bad {KEY_IS_INT_METADATA}") from None
    if bits.size < height or bits.size >= height + 8:
        raise SinkError(
            f"cannot read results from {where}: {KEY_IS_INT_METADATA} does not match its rows"
        )
    return pl.Series("__kint", bits[:height].astype(np.bool_))


class ParquetDirSink(StagedDirSink):
    """Two-phase Parquet output of window results; see the module docstring."""

    ext = "parquet"

    def __init__(
        self,
        path: str | os.PathLike[str],
        role: SinkRole = "results",
        run_token: str | None = None,
    ) -> None:
        if role != "results":
            raise ValueError(
                f"a parquet output can only hold results, not {role!r}; use jsonl for it"
            )
        if run_token is None:
            raise TypeError("ParquetDirSink needs a run_token")
        super().__init__(path, role, run_token)
        self._frames: dict[int, list[pl.DataFrame]] = {}
        self._prepared: dict[int, list[str]] = {}
        self._failed: dict[int, str] = {}
        #: a compound key's fields: each is a column of its own instead of ``key``
        self.key_fields: tuple[str, ...] | None = None

    def write(self, epoch: int, frame: pl.DataFrame) -> None:
        """Keep ``frame``'s typed columns for ``epoch`` until ``prepare``.

        Raises :class:`ValueError` if ``epoch`` is already prepared or committed, or the frame
        lacks an identity column.
        """
        check_epoch(epoch)
        if epoch in self._prepared:
            raise ValueError(f"epoch {epoch} is already prepared; it cannot take more rows")
        if epoch in self._failed:
            raise SinkError(self._failed[epoch])
        missing = [c for c in RESULT_ID_COLUMNS if c not in frame.columns]
        if missing:
            raise ValueError(f"the results frame lacks {', '.join(missing)}")
        if frame.height == 0:
            return
        if epoch not in self._frames:
            self._check_not_committed(epoch)
        typed = frame.drop(JSON_LINE, strict=False)
        self._frames.setdefault(epoch, []).append(typed)

    def prepare(self, epoch: int) -> list[str]:
        """Write the epoch's rows to its staging file, fsync it and the directory;
        return ``[final name]``, or ``[]`` when no rows were written.
        """
        check_epoch(epoch)
        if epoch in self._prepared:
            return list(self._prepared[epoch])
        if epoch in self._failed:
            raise SinkError(self._failed[epoch])
        frames = self._frames.get(epoch)
        if not frames:
            return []
        token = self.final_name(epoch)
        staging = self.path / self.staging_name(token)
        try:
            data = encode_results(frames, self.key_fields, staging)
        except SinkError as exc:
            self._failed[epoch] = str(exc)
            self._frames.pop(epoch, None)
            raise
        try:
            with open(staging, "wb") as f:
                f.write(data)
                fsync_file(f)
            fsync_dir(self.path)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(staging)
            err = SinkError(f"cannot write {self.role} to {staging}: {os_reason(exc)}")
            self._failed[epoch] = str(err)
            self._frames.pop(epoch, None)
            raise err from None
        del self._frames[epoch]
        self._prepared[epoch] = [token]
        return [token]

    def read_ids(self, files: list[CommittedFile]) -> pl.DataFrame:
        """Identity columns of ``files``, read file by file (types may differ)."""
        schema = id_schema("results")
        parts = [pl.DataFrame(schema=schema)]
        for path in self._files_of(files):
            parts.append(self.file_ids(path, read_own_file(path, "results")))
        return pl.concat(parts, how="vertical")

    def file_ids(self, path: Path | str, data: bytes) -> pl.DataFrame:
        """The identity columns of one Parquet file of results (``data``, read from
        ``path``, which messages name); see :meth:`read_ids`."""
        return results_file_ids(path, data, self.key_fields)

    def _discard_pending(self) -> None:
        self._frames.clear()
        self._prepared.clear()
        self._failed.clear()

    def _forget(self, epoch: int) -> None:
        self._prepared.pop(epoch, None)

    def close(self) -> None:
        """Drop rows not yet prepared (no checkpoint can refer to them)."""
        self._frames.clear()


def encode_results(frames: list[pl.DataFrame], key_fields: tuple[str, ...] | None,
                   where: Path | str) -> bytes:
    """One Parquet file of the results ``frames`` (typed columns, see the module
    docstring); :class:`SinkError` naming ``where`` when they cannot be written."""
    if key_fields is not None:
        table, meta = _typed_compound(_concat(frames), key_fields)
    else:
        table, meta = _typed(_concat(frames))
    buf = io.BytesIO()
    try:
        table.write_parquet(buf, metadata=meta or None)
    except pl.exceptions.PolarsError as exc:
        raise SinkError(f"cannot write results to {where}: {_first_line(exc)}") from None
    return buf.getvalue()


def results_file_ids(path: Path | str, data: bytes,
                     key_fields: tuple[str, ...] | None) -> pl.DataFrame:
    """The identity columns of one Parquet file of results (``data``, read from
    ``path``, which messages name), a compound key's ``key_fields`` given."""
    schema = id_schema("results")
    key_columns = list(key_fields) if key_fields is not None else ["key"]
    try:
        df = pl.read_parquet(data, columns=[*key_columns, "window_start", "window_end"])
        meta = pl.read_parquet_metadata(io.BytesIO(data))
    except pl.exceptions.PolarsError:
        other = _other_key(data, key_columns)
        if other is not None:
            raise SinkError(
                f"cannot read results from {path}: it holds the results of another "
                f"key (its columns are {other}), this pipeline's key is written as "
                f"{', '.join(key_columns)}; move the file out of the directory or "
                "give this pipeline its own sink.path") from None
        # never quote what the reader met: the file may hold anything
        raise SinkError(
            f"cannot read results from {path}: it is not a Parquet file of results "
            "as sealstream writes them; move the file out of the directory"
        ) from None
    if key_fields is not None:
        df = _compound_ids(df, meta, key_fields, path)
    key = df.get_column("key")
    if key_fields is not None:
        kint = df.get_column(_KINT)
    elif key.dtype.is_integer():
        kint = pl.Series("__kint", np.ones(df.height, dtype=np.bool_))
    else:
        kint = _kint_from(meta, df.height, path)
    try:
        return df.with_columns(kint).select(
            pl.col(name).cast(dtype, strict=True) for name, dtype in schema.items()
        )
    except pl.exceptions.PolarsError:
        raise SinkError(
            f"cannot read results from {path}: its key, window_start or window_end "
            "column has a type sealstream does not write"
        ) from None


def _other_key(data: bytes, key_columns: list[str]) -> str | None:
    """The columns of a readable Parquet file of results that lacks ``key_columns``
    (written for another key), or None."""
    try:
        names = list(pl.read_parquet_schema(io.BytesIO(data)))
    except pl.exceptions.PolarsError:
        return None
    if "window_start" not in names or all(c in names for c in key_columns):
        return None
    return ", ".join(names)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
