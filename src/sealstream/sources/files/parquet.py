"""Parquet partitions: one record per row.

Rows are read in batches with ``pyarrow.parquet.ParquetFile.iter_batches``
(resuming starts at the row group holding the position and skips the rows
before it). Offsets and ``byte_offset`` are row indices; ``_line`` is the
1-based row. Values are typed by column type: integer columns are integers
(a key from one has ``__kint`` True), float and decimal columns floats,
string columns strings (a time from one must be ISO-8601), booleans and
nested values "other"; a time column may also be a timestamp or date (converted
to ms since the epoch; naive timestamps are taken as UTC). A record's raw text
(for late events and bad records) is the row encoded as JSON, built only for
those rows. Batches are typed on the parse threads, ahead of the one served.
A file without the key or time column makes every row a bad
record (it lacks the field); a value column it lacks is null in every row.

The identity of a position is the file's size and a hash of its footer
(metadata): a Parquet file is rewritten, not appended to, so any change
invalidates a checkpoint. The file must not change while it is read either:
before every chunk it serves, including the last, the reader checks that the
path still names the file it opened (device and inode) and that its size and
footer are those it had when opened, else it raises
:class:`~sealstream.errors.SourceChangedError` naming the file.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import threading
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from dataclasses import field as dc_field
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from ...errors import SourceChangedError, SourceError
from .._base import OFFSET, RAW, Chunk, FieldPlan, PartitionPosition, RawSpan, RawTexts
from .._parse import (
    BOOL,
    FLOAT,
    INT,
    MISSING,
    OTHER,
    PARSE_AHEAD,
    STRING,
    I64Array,
    Typer,
    changed_error,
    changed_while_read,
    cls_schema,
    empty_bad,
    empty_events,
    json_str,
    no_texts,
    parse_pool,
    roles,
    stat_same_file,
)

DEFAULT_BATCH_ROWS = 65_536


def _classify(col: pl.Expr, dtype: pl.DataType, is_time: bool) -> tuple[pl.Expr, ...]:
    """(k, i, x, t) expressions for one column of the given type."""
    null_i, null_x = pl.lit(None, dtype=pl.Int64), pl.lit(None, dtype=pl.Float64)
    null_t = pl.lit(None, dtype=pl.String)
    present = col.is_not_null()
    if dtype == pl.Null:
        return pl.lit(MISSING, dtype=pl.Int8), null_i, null_x, null_t
    if dtype.is_integer():
        i = col.cast(pl.Int64, strict=False)
        k = pl.when(~present).then(MISSING).when(i.is_not_null()).then(INT).otherwise(FLOAT)
        return k, i, col.cast(pl.Float64), col.cast(pl.String)
    if dtype.is_float() or dtype.is_decimal():
        x = col.cast(pl.Float64)
        # a decimal column's text is its exact value (a declared decimal field reads it)
        t = col.cast(pl.String) if dtype.is_decimal() else x.cast(pl.String)
        return pl.when(present).then(FLOAT).otherwise(MISSING), null_i, x, t
    if is_time and dtype.is_temporal() and isinstance(dtype, (pl.Datetime, pl.Date)):
        i = col.dt.epoch("ms")
        return pl.when(present).then(INT).otherwise(MISSING), i, null_x, i.cast(pl.String)
    if dtype == pl.String or isinstance(dtype, (pl.Categorical, pl.Enum)) or dtype.is_temporal():
        t = col.cast(pl.String)
        return pl.when(present).then(STRING).otherwise(MISSING), null_i, null_x, t
    if dtype == pl.Boolean:
        t = pl.when(col).then(pl.lit("true")).otherwise(pl.lit("false"))
        return pl.when(present).then(BOOL).otherwise(MISSING), null_i, null_x, t
    if dtype == pl.Binary:
        t = json_str(col.bin.encode("hex"))
    else:
        t = (
            pl.struct(col.alias("v"))
            .struct.json_encode()
            .str.strip_prefix('{"v":')
            .str.strip_suffix("}")
        )
    return pl.when(present).then(OTHER).otherwise(MISSING), null_i, null_x, t


def _row_json(frame: pl.DataFrame) -> pl.Expr:
    cols = [
        pl.col(name).bin.encode("hex") if dtype == pl.Binary else pl.col(name)
        for name, dtype in frame.schema.items()
    ]
    return pl.struct(cols).struct.json_encode()


@dataclass
class _Typed:
    """One batch of rows, typed: rows ``first..end-1``."""

    events: pl.DataFrame
    bad: pl.DataFrame
    first: int
    end: int
    texts: RawTexts
    ev_off: I64Array = dc_field(init=False)
    bad_off: I64Array = dc_field(init=False)

    def __post_init__(self) -> None:
        self.ev_off = self.events[OFFSET].to_numpy().astype(np.int64, copy=False)
        self.bad_off = self.bad["_offset"].to_numpy().astype(np.int64, copy=False)


def _utc_timestamps(batch: pa.RecordBatch) -> pa.RecordBatch:
    """Time-zone-aware timestamp columns relabelled UTC. Arrow stores their values as
    UTC instants whatever the zone, so nothing changes but the label, which Polars
    may not know (fixed offsets such as ``+05:30``)."""
    fields = batch.schema
    if not any(pa.types.is_timestamp(f.type) and f.type.tz not in (None, "UTC")
               for f in fields):
        return batch
    cols = [c.view(pa.timestamp(f.type.unit, tz="UTC"))
            if pa.types.is_timestamp(f.type) and f.type.tz not in (None, "UTC") else c
            for f, c in zip(fields, batch.columns, strict=True)]
    return pa.RecordBatch.from_arrays(cols, names=fields.names)


class ParquetReader:
    """A Parquet file as a partition. See the module docstring."""

    def __init__(
        self,
        name: str,
        path: Path,
        plan: FieldPlan,
        position: PartitionPosition | None = None,
        batch_rows: int = DEFAULT_BATCH_ROWS,
    ) -> None:
        self.name = name
        self._path = path
        self._plan = plan
        self._roles = roles(plan)
        self._typer = Typer(plan, 1)
        try:
            # our own descriptor watches the file while pyarrow reads it
            self._fd = os.open(path, os.O_RDONLY)
        except OSError as e:
            raise SourceError(f"cannot read {str(path)!r}: {e.strerror or e}") from e
        try:
            st = os.fstat(self._fd)
            self._size = st.st_size
            self._file_id = (st.st_dev, st.st_ino)
            self._file = pq.ParquetFile(path)
            footer = self._footer()
        except OSError as e:
            os.close(self._fd)
            raise SourceError(f"cannot read {str(path)!r}: {e.strerror or e}") from e
        except (pa.ArrowException, ValueError) as e:
            os.close(self._fd)
            raise SourceError(f"cannot read {str(path)!r} as Parquet: {e}") from e
        self._identity = {"file_size": self._size, "footer_sha256": footer}
        self._rows = self._file.metadata.num_rows
        try:
            self._check_unchanged()  # pyarrow opened the file we watch
            start = self._check(position)
        except BaseException:
            self._file.close()
            os.close(self._fd)
            raise
        self._next_row = start
        self._consumed = start
        self._batch_rows = max(1, batch_rows)
        self._batches = self._iter_from(start)
        self._ahead: deque[Future[_Typed | None]] = deque()
        self._batches_done = False
        # batches are read on the parse threads, one after another: task n waits
        # for its turn (tasks start in submission order, so no task waits on one
        # that has not started), reads, then types its batch beside the others
        self._turn = threading.Condition()
        self._next_ticket = 0
        self._reading = 0
        self._stopping = False  # the tickets still waiting return None without reading
        self._typed = _Typed(empty_events(plan), empty_bad(), start, start, no_texts)
        self._finished = False

    def _check(self, position: PartitionPosition | None) -> int:
        """Check ``position``; the row to start from. (A key or time column the file
        lacks makes every row a bad record, as a JSON line without the field is.)"""
        if position is None or not (position.byte_offset or position.identity):
            return 0
        if position.identity and position.identity != self._identity:
            raise changed_error(self.name, position, "the file was rewritten or replaced")
        if position.byte_offset > self._rows:
            raise changed_error(self.name, position, f"the file now has only {self._rows} rows")
        return position.byte_offset

    def _footer(self) -> str:
        tail = os.pread(self._fd, 8, max(0, self._size - 8))
        n = int.from_bytes(tail[:4], "little") if len(tail) == 8 else 0
        return hashlib.sha256(os.pread(self._fd, n + 8, max(0, self._size - 8 - n))).hexdigest()

    def _check_unchanged(self) -> None:
        """Raise :class:`SourceChangedError` when the file changed since it was
        opened: its path names another file, or its size or footer differ."""
        st = stat_same_file(self.name, self._path, self._fd, self._file_id)
        if st.st_size != self._size:
            raise self._changed(f"it is now {st.st_size} bytes, it had {self._size} when opened")
        try:
            footer = self._footer()
        except OSError as e:
            raise SourceError(f"cannot read {str(self._path)!r}: {e.strerror or e}") from e
        if footer != self._identity["footer_sha256"]:
            raise self._changed("its footer differs (the file was rewritten)")

    def _changed(self, what: str) -> SourceChangedError:
        return changed_while_read(self.name, self._path, what)

    def _iter_from(self, row: int) -> Iterator[tuple[int, pa.RecordBatch]]:
        md = self._file.metadata
        first, group_start = 0, 0
        while first < md.num_row_groups and group_start + md.row_group(first).num_rows <= row:
            group_start += md.row_group(first).num_rows
            first += 1
        at = group_start
        groups = list(range(first, md.num_row_groups))
        if not groups:
            return
        try:
            for batch in self._file.iter_batches(batch_size=self._batch_rows, row_groups=groups):
                skip = min(max(0, row - at), batch.num_rows)
                if skip < batch.num_rows:
                    yield at + skip, batch.slice(skip)
                at += batch.num_rows
        except (OSError, pa.ArrowException) as e:
            raise SourceError(f"cannot read {str(self._path)!r}: {e}") from e

    def _type(self, first_row: int, batch: pa.RecordBatch) -> _Typed:
        """Type one batch (on a parse thread)."""
        batch = _utc_timestamps(batch)
        try:
            frame = pl.from_arrow(batch)
        except (pl.exceptions.PolarsError, pa.ArrowException, ValueError, TypeError) as e:
            raise SourceError(f"cannot read {str(self._path)!r}: rows {first_row + 1}-"
                              f"{first_row + batch.num_rows}: {str(e).splitlines()[0]}") from e
        assert isinstance(frame, pl.DataFrame)
        exprs: list[pl.Expr] = [
            pl.int_range(first_row, first_row + frame.height, dtype=pl.Int64).alias(OFFSET),
        ]
        for j, field in enumerate(self._roles):
            if field in frame.columns:
                k, i, x, t = _classify(pl.col(field), frame.schema[field], is_time=j == 1)
            else:
                k, i, x, t = _classify(pl.lit(None), pl.Null(), is_time=j == 1)
            exprs += [
                k.cast(pl.Int8).alias(f"k{j}"),
                i.cast(pl.Int64).alias(f"i{j}"),
                x.cast(pl.Float64).alias(f"x{j}"),
                t.cast(pl.String).alias(f"t{j}"),
            ]
        cls = (
            frame.select(exprs)
            if frame.height
            else pl.DataFrame(schema=cls_schema(len(self._roles)))
        )
        row_json = _row_json(frame)

        def texts(offsets: I64Array) -> pl.Series:
            rows = pl.Series(np.asarray(offsets, np.int64) - first_row, dtype=pl.Int64)
            return frame[rows].select(row_json.alias(RAW)).to_series()

        events, bad = self._typer(cls, texts)
        return _Typed(events, bad, first_row, first_row + frame.height, texts)

    def _read_and_type(self, ticket: int) -> _Typed | None:
        """Read the next batch when it is this ticket's turn, then type it (on a
        parse thread); None once the file is read to its end."""
        with self._turn:
            self._turn.wait_for(lambda: self._stopping or self._reading == ticket)
            if self._reading != ticket:
                return None  # stopping
            try:
                item = next(self._batches, None)
            finally:
                self._reading += 1
                self._turn.notify_all()
        return None if item is None else self._type(*item)

    def _next_typed(self) -> _Typed | None:
        """The next typed batch, keeping up to PARSE_AHEAD more reading behind it."""
        while len(self._ahead) < PARSE_AHEAD + 1 and not self._batches_done:
            self._ahead.append(parse_pool().submit(self._read_and_type, self._next_ticket))
            self._next_ticket += 1
        if not self._ahead:
            return None
        typed = self._ahead.popleft().result()
        if typed is None:
            self._batches_done = True
            self._stop_ahead()
        return typed

    def _stop_ahead(self) -> None:
        """Let the tasks ahead finish without reading more (none is cancelled: a
        task may already wait for its turn behind a queued one), and wait for them:
        they use the file."""
        with self._turn:
            self._stopping = True
            self._turn.notify_all()
        for fut in self._ahead:
            with contextlib.suppress(BaseException):
                fut.result()
        self._ahead.clear()

    def next_chunk(self, max_records: int) -> Chunk | None:
        if max_records < 1:
            raise ValueError(f"max_records must be at least 1, got {max_records}")
        if self._finished:
            return None
        typed = self._typed
        if self._next_row >= typed.end:
            try:
                item = self._next_typed()
            except SourceError:
                self._check_unchanged()  # a file cut short fails to read: say why
                raise
            self._check_unchanged()  # the rows were read before any is served
            if item is None:
                self._finished = True
                pos = PartitionPosition(self._next_row, self._next_row, dict(self._identity))
                return Chunk(empty_events(self._plan), empty_bad(), None, pos, eof=True)
            self._typed = typed = item
            self._next_row = item.first
        else:
            self._check_unchanged()
        lo = self._next_row
        hi = min(typed.end, lo + max_records) - 1
        e0, e1 = np.searchsorted(typed.ev_off, [lo, hi + 1])
        b0, b1 = np.searchsorted(typed.bad_off, [lo, hi + 1])
        events = typed.events.slice(int(e0), int(e1 - e0))
        bad = typed.bad.slice(int(b0), int(b1 - b0))
        self._next_row = hi + 1
        self._consumed = hi + 1
        eof = hi + 1 >= self._rows
        self._finished = eof
        pos = PartitionPosition(hi + 1, hi + 1, dict(self._identity))
        return Chunk(events, bad, hi, pos, eof, RawSpan(lo, hi, typed.texts))

    def size_hint(self) -> tuple[int, int] | None:
        if self._rows == 0:
            return self._size, self._size
        return int(self._size * self._consumed / self._rows), self._size

    def close(self) -> None:
        self._stop_ahead()
        self._file.close()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def identity(self) -> dict[str, Any]:
        return dict(self._identity)
