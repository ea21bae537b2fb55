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
    os_reason,
    read_own_file,
)

__all__ = ["KEY_IS_INT_METADATA", "ParquetDirSink"]

KEY_IS_INT_METADATA = "sealstream.key_is_int"
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


def _kint_from(meta: dict[str, str], height: int, where: Path) -> pl.Series:
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
        table, meta = _typed(_concat(frames))
        token = self.final_name(epoch)
        staging = self.path / self.staging_name(token)
        try:
            # serialise in memory first so that I/O errors are plain OSErrors
            buf = io.BytesIO()
            table.write_parquet(buf, metadata=meta or None)
            with open(staging, "wb") as f:
                f.write(buf.getbuffer())
                fsync_file(f)
            fsync_dir(self.path)
        except (OSError, pl.exceptions.PolarsError) as exc:
            with contextlib.suppress(OSError):
                os.unlink(staging)
            reason = os_reason(exc) if isinstance(exc, OSError) else _first_line(exc)
            err = SinkError(f"cannot write {self.role} to {staging}: {reason}")
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
            data = read_own_file(path, "results")
            try:
                df = pl.read_parquet(data, columns=["key", "window_start", "window_end"])
                meta = pl.read_parquet_metadata(io.BytesIO(data))
            except pl.exceptions.PolarsError:
                # never quote what the reader met: the file may hold anything
                raise SinkError(
                    f"cannot read results from {path}: it is not a Parquet file of results "
                    "as sealstream writes them; move the file out of the directory"
                ) from None
            key = df.get_column("key")
            if key.dtype.is_integer():
                kint = pl.Series("__kint", np.ones(df.height, dtype=np.bool_))
            else:
                kint = _kint_from(meta, df.height, path)
            try:
                parts.append(
                    df.with_columns(kint).select(
                        pl.col(name).cast(dtype, strict=True) for name, dtype in schema.items()
                    )
                )
            except pl.exceptions.PolarsError:
                raise SinkError(
                    f"cannot read results from {path}: its key, window_start or window_end "
                    "column has a type sealstream does not write"
                ) from None
        return pl.concat(parts, how="vertical")

    def _discard_pending(self) -> None:
        self._frames.clear()
        self._prepared.clear()
        self._failed.clear()

    def _forget(self, epoch: int) -> None:
        self._prepared.pop(epoch, None)

    def close(self) -> None:
        """Drop rows not yet prepared (no checkpoint can refer to them)."""
        self._frames.clear()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
