"""A directory of JSON Lines files, published one file per epoch and run.

Layout of ``path`` (created with its parents when missing)::

    part-000000000007-a1b2c3.jsonl              committed: readers glob *.jsonl
    .part-000000000008-a1b2c3.jsonl.inprogress  staged: ignored by readers

Guarantees:

* Every line of a committed file is one value of the written frames' ``__json``
  column, followed by ``\\n``; a file holds exactly the rows written for its
  epoch by one run, in write order. Files are never appended to after commit.
* Staged rows are invisible (hidden name, wrong suffix) until :meth:`commit`
  renames the staging file in one atomic step. ``prepare`` fsyncs the staging
  file and the directory, so a prepared epoch survives a crash.
* An epoch with no rows produces no file and ``prepare`` returns ``[]``.
* Every :class:`OSError` becomes a one-line :class:`~sealstream.errors.SinkError`
  naming the path and the OS reason; a failed write deletes its staging file
  and poisons the epoch (``prepare`` then raises), so a partial file is never
  published.

Assumed: ``__json`` values are single-line JSON texts without nulls (checked,
:class:`ValueError` otherwise). For role ``"results"`` each line is an object
whose ``key`` is a JSON string or integer and whose ``window_start`` /
``window_end`` are integers; for ``"records"`` each has ``_partition`` (string)
and ``_offset`` (integer).
"""

from __future__ import annotations

import contextlib
import io
import os
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

import polars as pl

from sealstream.errors import SinkError
from sealstream.sinks._base import JSON_LINE, CommittedFile, SinkRole
from sealstream.sinks._files import (
    StagedDirSink,
    check_epoch,
    fsync_dir,
    fsync_file,
    id_schema,
    json_value_text,
    read_own_file,
    split_json_fields,
)
from sealstream.sources._parse import compound_key_text

__all__ = ["JsonlDirSink", "json_file_ids", "json_lines_bytes", "read_json_ids", "result_ids"]


def json_lines_bytes(frame: pl.DataFrame) -> bytes:
    """The ``__json`` column of ``frame`` as UTF-8 text, one value per line (columnar).

    Raises :class:`ValueError` if the column is missing, not String, holds a
    null, or a value contains a line break.
    """
    if JSON_LINE not in frame.columns:
        raise ValueError(f"the frame has no {JSON_LINE!r} column (columns: {frame.columns})")
    col = frame.get_column(JSON_LINE)
    if col.dtype != pl.String:
        raise ValueError(f"column {JSON_LINE!r} must be String, not {col.dtype}")
    if col.null_count():
        raise ValueError(f"column {JSON_LINE!r} has {col.null_count()} null value(s)")
    if col.str.contains("[\n\r]").any():
        raise ValueError(f"column {JSON_LINE!r} has a value with a line break")
    # one unquoted CSV column is the values verbatim, each ended by \n: written by
    # polars straight into a buffer, with no Python string of the whole text
    buf = io.BytesIO()
    frame.select(col).write_csv(buf, include_header=False, quote_style="never")
    return buf.getvalue()


def read_json_ids(paths: list[Path], role: SinkRole,
                  key_fields: tuple[str, ...] | None = None) -> pl.DataFrame:
    """Read the identity columns (see :func:`~sealstream.sinks._files.id_schema`)
    from JSON Lines files, columnar, file by file. Raises :class:`SinkError` naming
    the file when it cannot be read or parsed, is not a regular file (a symbolic
    link is refused, not followed: see :func:`~sealstream.sinks._files.read_own_file`),
    or a line lacks an identity field. Messages never quote the file's content.

    The key's text comes from a String read (integers keep their exact digits,
    however long); ``__kint`` from a second, lenient Float64 read of the same
    field, which is non-null exactly when the key is a JSON number. Both reads
    parse the top-level field, so nested objects named ``key`` cannot confuse it.
    """
    schema = id_schema(role)
    parts = [pl.DataFrame(schema=schema)]
    for path in paths:
        data = read_own_file(path, role)
        if data.strip():
            parts.append(_parse_ids(data, path, role, key_fields))
    return pl.concat(parts, how="vertical")


def result_ids(data: bytes, where: Path | str, key_fields: tuple[str, ...] | None) -> pl.DataFrame:
    """The identity columns of the result lines ``data`` (read from ``where``, which
    messages name), one row per line in order; see :func:`read_json_ids`."""
    return _parse_ids(data, where, "results", key_fields)


def json_file_ids(data: bytes, where: Path | str, role: SinkRole,
                  key_fields: tuple[str, ...] | None = None) -> pl.DataFrame:
    """The identity columns of one JSON Lines file of ``role`` (``data``, read from
    ``where``, which messages name); see :func:`read_json_ids`."""
    schema = id_schema(role)
    if not data.strip():
        return pl.DataFrame(schema=schema)
    return _parse_ids(data, where, role, key_fields)


def _compound_ids(data: bytes, fields: tuple[str, ...]) -> pl.DataFrame:
    """Identities of result lines with a compound key: the key text rebuilt from each
    field (``"tenant":"acme","user":7``), as the engine builds it (a float keeps its
    fraction: ``7.0`` is not ``7``)."""
    parts = split_json_fields(data, fields)
    text = pl.read_ndjson(data, schema={"window_start": pl.Int64, "window_end": pl.Int64})
    values = pl.DataFrame({f"v{n}": part.select(json_value_text(pl.col("kind"), pl.col("text"))
                                                ).to_series()
                           for n, part in enumerate(parts)})
    key = values.select(compound_key_text(fields, [pl.col(f"v{n}") for n in range(len(fields))])
                        .alias("key"))
    return text.select(key.to_series(), pl.lit(False).alias("__kint"),
                       "window_start", "window_end")


def _parse_ids(data: bytes, where: Path | str, role: SinkRole,
               key_fields: tuple[str, ...] | None = None) -> pl.DataFrame:
    schema = id_schema(role)
    try:
        if role == "results" and key_fields is not None:
            ids = _compound_ids(data, key_fields).select(list(schema))
        elif role == "results":
            ids = pl.read_ndjson(
                data,
                schema={"key": pl.String, "window_start": pl.Int64, "window_end": pl.Int64},
            )
            numeric = pl.read_ndjson(data, schema={"key": pl.Float64}, ignore_errors=True)
            ids = ids.with_columns(numeric.get_column("key").is_not_null().alias("__kint")).select(
                list(schema)
            )
        else:
            ids = pl.read_ndjson(data, schema=schema)
    except pl.exceptions.PolarsError:
        # the parser's message quotes the text it met: never show it (the file may
        # hold anything, e.g. a hard link to someone's secret)
        raise SinkError(
            f"cannot read {role} from {where}: it is not JSON Lines as sealstream writes "
            "them (a line is not a JSON object); move the file out of the directory"
        ) from None
    nulls = [c for c in ids.columns if ids.get_column(c).null_count()]
    if nulls:
        raise SinkError(
            f"cannot read {role} from {where}: some lines lack {', '.join(nulls)} "
            "(or have a value of the wrong type)"
        )
    return ids


class JsonlDirSink(StagedDirSink):
    """Two-phase JSON Lines output to a directory; see the module docstring.

    ``write`` appends to the epoch's staging file right away (one columnar
    write per call, flushed so that I/O errors surface in ``write``), so memory
    stays bounded by one frame. The staging file of an epoch is truncated when
    this sink object first writes to it.
    """

    ext = "jsonl"

    def __init__(self, path: str | os.PathLike[str], role: SinkRole, run_token: str) -> None:
        super().__init__(path, role, run_token)
        self._open: dict[int, BinaryIO] = {}
        #: a compound key's fields: result lines name each one instead of ``key``
        self.key_fields: tuple[str, ...] | None = None
        self._prepared: dict[int, list[str]] = {}
        self._failed: dict[int, str] = {}

    def _staging_path(self, epoch: int) -> Path:
        return self.path / self.staging_name(self.final_name(epoch))

    def write(self, epoch: int, frame: pl.DataFrame) -> None:
        """Stage the ``__json`` lines of ``frame`` for ``epoch`` (no-op for 0 rows).

        Raises :class:`ValueError` if ``epoch`` is already prepared or committed, or the frame
        breaks the ``__json`` assumptions, :class:`SinkError` on an I/O error.
        """
        check_epoch(epoch)
        if epoch in self._prepared:
            raise ValueError(f"epoch {epoch} is already prepared; it cannot take more rows")
        if epoch in self._failed:
            raise SinkError(self._failed[epoch])
        if frame.height == 0:
            return
        data = json_lines_bytes(frame)
        if epoch not in self._open:
            self._check_not_committed(epoch)
        staging = self._staging_path(epoch)
        try:
            f = self._open.get(epoch)
            if f is None:
                f = open(staging, "wb")  # noqa: SIM115 - kept open across writes
                self._open[epoch] = f
            f.write(data)
            f.flush()
        except OSError as exc:
            raise self._fail(epoch, self._sink_error("write", staging, exc)) from None

    def _fail(self, epoch: int, err: SinkError) -> SinkError:
        """Close and delete the epoch's staging file; remember the failure."""
        f = self._open.pop(epoch, None)
        if f is not None:
            with contextlib.suppress(OSError):
                f.close()
        with contextlib.suppress(OSError):
            os.unlink(self._staging_path(epoch))
        self._failed[epoch] = str(err)
        return err

    def prepare(self, epoch: int) -> list[str]:
        """Fsync the epoch's staging file and the directory; return ``[final name]``,
        or ``[]`` when nothing was written. Calling it again returns the same tokens.
        """
        tokens, durable = self.prepare_deferred(epoch)
        try:
            durable()
        except SinkError as err:
            self._prepared.pop(epoch, None)  # not prepared after all: the epoch failed
            raise self._fail(epoch, err) from None
        return tokens

    def prepare_deferred(self, epoch: int) -> tuple[list[str], Callable[[], None]]:
        """The epoch's staging file is closed now; the callable fsyncs it and the
        directory (see :meth:`Sink.prepare_deferred`)."""
        check_epoch(epoch)
        if epoch in self._prepared:
            return list(self._prepared[epoch]), lambda: None
        if epoch in self._failed:
            raise SinkError(self._failed[epoch])
        f = self._open.get(epoch)
        if f is None:
            return [], lambda: None
        staging = self._staging_path(epoch)
        try:
            f.flush()
            f.close()
        except OSError as exc:
            raise self._fail(epoch, self._sink_error("write", staging, exc)) from None
        del self._open[epoch]
        tokens = [self.final_name(epoch)]
        self._prepared[epoch] = tokens

        def durable() -> None:
            try:
                fd = os.open(staging, os.O_RDONLY)
                try:
                    fsync_file(fd)
                finally:
                    os.close(fd)
                fsync_dir(self.path)
            except OSError as exc:
                raise self._sink_error("write", staging, exc) from None

        return list(tokens), durable

    def read_ids(self, files: list[CommittedFile]) -> pl.DataFrame:
        return read_json_ids(self._files_of(files), self.role, self.key_fields)

    def _discard_pending(self) -> None:
        for f in self._open.values():
            with contextlib.suppress(OSError):
                f.close()
        self._open.clear()
        self._prepared.clear()
        self._failed.clear()

    def _forget(self, epoch: int) -> None:
        self._prepared.pop(epoch, None)

    def close(self) -> None:
        """Close open staging files (their data stays on disk for ``recover``)."""
        for f in self._open.values():
            with contextlib.suppress(OSError):
                f.close()
        self._open.clear()
