"""CSV partitions: a header line, then one record per row.

Fields are separated by ``,`` and may be quoted with ``"`` (``""`` inside
quotes is a quote), as in RFC 4180. Record boundaries are the newlines outside
quotes, found with numpy from the parity of the quotes before them, so a quoted
field may hold commas and newlines. A record's offset is the 0-based index of
its first physical line minus one (the header is line 0), so ``_line`` (offset
+ 2) is the record's true 1-based line in the file even after quoted newlines;
offsets then have gaps, like blank lines do. Blank (whitespace-only) lines are
not records. A row whose field count differs from the header's is a bad record.

A quote inside an unquoted field (not RFC 4180) shifts the quote parity: the
lines up to the next quote then form one record, reported as bad.

Values are text: an empty field is missing (null); the key is always text
(``__kint`` False); the time is an integer when it is digits with an optional
``-``, else an ISO-8601 string, else bad; a value field is an integer, a float
(decimal or exponent notation, no inf/nan), or a string. A header without
the key or time column makes every row a bad record (it lacks the field); a
value column the header lacks is null in every row. ``__raw`` maps each header name to the row's
text (a repeated header name gets a ``_2``, ``_3``... suffix there).

The good path parses the block with ``polars.read_csv`` (all columns String);
a block it refuses (invalid UTF-8, a stray quote) is parsed record by record
with Python's :mod:`csv` module to find the bad rows.
"""

from __future__ import annotations

import csv as pycsv
import io
from typing import Any

import numpy as np
import numpy.typing as npt
import polars as pl

from ...errors import SourceError
from .._base import OFFSET, RAW, PartitionPosition, RawTexts
from .._parse import (
    FLOAT,
    INT,
    MISSING,
    STRING,
    BlockLines,
    I64Array,
    LineFileReader,
    Typed,
    bad_frame,
    changed_error,
    nonblank_mask,
    string_views,
    strip_eol,
    text_lengths,
    valid_utf8,
)

_INT_TEXT = r"^[+-]?[0-9]+$"
_TIME_INT_TEXT = r"^-?[0-9]+$"
_FLOAT_TEXT = r"^[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?$"


def _terminators(a: npt.NDArray[np.uint8], parity: int = 0) -> tuple[I64Array, I64Array]:
    """All newline positions, and those outside quotes (record terminators);
    ``parity`` is 1 when ``a`` starts inside a quoted field."""
    nl = np.flatnonzero(a == 10).astype(np.int64)
    q = np.flatnonzero(a == 34)
    return nl, nl[((np.searchsorted(q, nl) + parity) % 2) == 0]


def _unique(names: list[str]) -> list[str]:
    seen: dict[str, int] = {}
    out = []
    for name in names:
        seen[name] = seen.get(name, 0) + 1
        out.append(name if seen[name] == 1 else f"{name}_{seen[name]}")
    return out


class CsvReader(LineFileReader):
    """A CSV file with a header line as a partition. See the module docstring."""

    line_delta = 2
    _header: list[str]
    """The header's column names (set by :meth:`_read_header`, on opening)."""
    _cls_exprs: list[pl.Expr] | None = None

    # -- header and start ----------------------------------------------------
    def _read_header(self) -> tuple[int, int]:
        """Parse the header; return (byte after it, newlines up to there)."""
        data = b""
        at = 0
        while True:
            more = self._pread(at, 1 << 16)
            data += more
            at += len(more)
            a = np.frombuffer(data, np.uint8)
            nl, term = _terminators(a)
            starts = np.concatenate([[0], term + 1]).astype(np.int64)
            stops = np.append(term + 1, np.int64(len(data)))
            nonblank = nonblank_mask(a, starts, stops)
            found = np.flatnonzero(nonblank[:-1] if more else nonblank)
            if len(found):
                r = int(found[0])
                break
            if not more:
                # empty, or blank lines only: no header and no records, an empty
                # partition (as an empty JSONL file is)
                self._header = []
                return len(data), int(np.count_nonzero(a == 10))
        record = strip_eol(data[starts[r] : stops[r]])
        try:
            text = record.decode("utf-8-sig")
            header = next(pycsv.reader(io.StringIO(text, newline="")))
        except (UnicodeDecodeError, pycsv.Error, StopIteration) as e:
            raise SourceError(f"CSV file {str(self._path)!r} has an unreadable header: {e}") from e
        # a key or time column absent from the header makes every row a bad record
        # ("missing key field"), as a JSON line without the field is
        self._header = header
        end = int(stops[r])
        return end, int(np.count_nonzero(a[:end] == 10))

    def _start(self, position: PartitionPosition | None) -> tuple[int, int]:
        header_end, header_newlines = self._read_header()
        if position is None or (position.byte_offset == 0 and not position.identity):
            return header_newlines - 1, header_end
        line, byte = super()._start(position)
        if byte < header_end:
            raise changed_error(self.name, position, "that position lies inside the header")
        return line, byte

    def _cut(self, data: bytes, prefix: bytes) -> int:
        _, term = _terminators(np.frombuffer(data, np.uint8), prefix.count(b'"') % 2)
        return int(term[-1]) + 1 if len(term) else 0

    # -- blocks --------------------------------------------------------------
    def _lines(self, buf: bytes, a: npt.NDArray[np.uint8], first_line: int) -> BlockLines:
        nl, term = _terminators(a)
        starts = np.concatenate([[0], term + 1]).astype(np.int64)
        stops = term + 1
        partial = len(buf) > int(starts[-1])
        if partial:
            stops = np.append(stops, np.int64(len(buf)))
        else:
            starts = starts[:-1]
        nonblank = nonblank_mask(a, starts, stops)
        rec_idx = np.flatnonzero(nonblank).astype(np.int64)
        rec_off = first_line + np.searchsorted(nl, starts[rec_idx]).astype(np.int64)
        if partial and nonblank[-1]:
            end_line = len(nl) + (0 if buf.endswith(b"\n") else 1)
            end_byte = len(buf)
        else:
            end_line = len(nl)
            end_byte = int(term[-1]) + 1 if len(term) else 0
        return BlockLines(buf, a, starts, stops, rec_idx, rec_off, end_line, end_byte, len(nl))

    def _type_block(self, block: BlockLines, prepared: Any) -> Typed:
        buf, a, rec_off = block.buf, block.a, block.rec_off
        starts, stops = block.starts[block.rec_idx], block.stops[block.rec_idx]
        m = len(self._header)
        names = [f"c{i}" for i in range(m)]
        frame: pl.DataFrame | None = None
        if valid_utf8(buf, a):
            q = np.flatnonzero(a == 34)
            commas = np.flatnonzero(a == 44)
            outside = commas[(np.searchsorted(q, commas) % 2) == 0]
            nfields = np.searchsorted(outside, stops) - np.searchsorted(outside, starts) + 1
            good = nfields == m
            line_text = string_views(buf, a, starts, text_lengths(a, starts, stops))
            if good.all() and self._contiguous(starts, stops):
                pbuf = buf[int(starts[0]) : int(stops[-1])]
            else:  # drop blank lines and rows with a wrong field count
                keep = np.zeros(len(a) + 1, np.int8)
                keep[starts[good]] += 1
                keep[stops[good]] -= 1
                pbuf = a[np.cumsum(keep[:-1], dtype=np.int64) > 0].tobytes()
            try:
                frame = pl.read_csv(
                    pbuf,
                    has_header=False,
                    schema=dict.fromkeys(names, pl.String()),
                    quote_char='"',
                    infer_schema=False,
                    empty_string_is_null=False,
                    raise_if_empty=False,
                )
            except (Exception, pl.exceptions.PanicException):  # e.g. a stray quote
                frame = None
            if frame is not None and frame.height != int(good.sum()):
                frame = None
            if frame is not None:
                sel = pl.Series(np.flatnonzero(good), dtype=pl.UInt32)
                frame = frame.with_columns(
                    pl.Series(OFFSET, rec_off[good], dtype=pl.Int64),
                    line_text.gather(sel).alias("__braw"),
                )
                bad_idx = np.flatnonzero(~good)
                bad = bad_frame(
                    [int(rec_off[i]) for i in bad_idx],
                    [int(rec_off[i]) + self.line_delta for i in bad_idx],
                    [f"row has {int(nfields[i])} fields but the header has {m}" for i in bad_idx],
                    line_text.gather(pl.Series(bad_idx, dtype=pl.UInt32)).to_list(),
                )
        if frame is None:
            frame, bad = self._slow_rows(buf, starts, stops, rec_off, names)
        events, typed_bad = self._typer(self._classify(frame, names))
        if bad.height:
            typed_bad = pl.concat([typed_bad, bad]).sort("_offset")
        return events, typed_bad, self._texts(frame.select(OFFSET, *names))

    def _texts(self, fields: pl.DataFrame) -> RawTexts:
        """Offsets -> each record as a JSON object (header -> text), from its fields."""
        raw = self._raw_json()

        def texts(offsets: I64Array) -> pl.Series:
            want = pl.DataFrame({OFFSET: pl.Series(offsets, dtype=pl.Int64)})
            rows = want.join(fields, on=OFFSET, how="left", maintain_order="left")
            return rows.select(raw).to_series()

        return texts

    def _raw_json(self) -> pl.Expr:
        names = [f"c{i}" for i in range(len(self._header))]
        header_names = _unique(self._header)
        return (
            pl.struct(
                [pl.col(c).fill_null("").alias(h) for c, h in zip(names, header_names, strict=True)]
            )
            .struct.json_encode()
            .alias(RAW)
        )

    @staticmethod
    def _contiguous(starts: I64Array, stops: I64Array) -> bool:
        return bool(len(starts)) and bool((starts[1:] == stops[:-1]).all())

    def _slow_rows(
        self, buf: bytes, starts: I64Array, stops: I64Array, rec_off: I64Array, names: list[str]
    ) -> tuple[pl.DataFrame, pl.DataFrame]:
        m = len(names)
        rows: list[list[str]] = []
        offs: list[int] = []
        texts: list[str] = []
        bad_off: list[int] = []
        bad_reason: list[str] = []
        bad_raw: list[str] = []
        for s, e, off in zip(starts.tolist(), stops.tolist(), rec_off.tolist(), strict=True):
            record = strip_eol(buf[s:e])
            try:
                text = record.decode("utf-8")
            except UnicodeDecodeError as err:
                bad_off.append(off)
                bad_reason.append(f"invalid UTF-8 at byte {err.start + 1} of the row")
                bad_raw.append(record.decode("utf-8", "replace"))
                continue
            try:
                parsed = list(pycsv.reader(io.StringIO(text, newline=""), strict=True))
            except pycsv.Error as err:
                parsed, problem = [], f"invalid CSV row: {err}"
            else:
                problem = "invalid CSV row: a quote inside an unquoted field"
            if len(parsed) != 1:
                bad_off.append(off)
                bad_reason.append(problem)
                bad_raw.append(text)
                continue
            fields = parsed[0]
            if len(fields) != m:
                bad_off.append(off)
                bad_reason.append(f"row has {len(fields)} fields but the header has {m}")
                bad_raw.append(text)
                continue
            rows.append(fields)
            offs.append(off)
            texts.append(text)
        schema = dict.fromkeys(names, pl.String())
        frame = pl.DataFrame(rows, schema=schema, orient="row").with_columns(
            pl.Series(OFFSET, offs, dtype=pl.Int64), pl.Series("__braw", texts, dtype=pl.String)
        )
        lines = [o + self.line_delta for o in bad_off]
        return frame, bad_frame(bad_off, lines, bad_reason, bad_raw)

    def _classify(self, frame: pl.DataFrame, names: list[str]) -> pl.DataFrame:
        """Text columns -> the k/i/x/t columns of ``_parse`` (per role)."""
        if frame.height == 0:
            return pl.DataFrame(schema=self._schema)
        if self._cls_exprs is None:
            self._cls_exprs = self._classify_exprs(names)
        return frame.select(self._cls_exprs)

    def _classify_exprs(self, names: list[str]) -> list[pl.Expr]:
        exprs: list[pl.Expr] = [pl.col(OFFSET), pl.col("__braw")]
        for j, field in enumerate(self._roles):
            text: pl.Expr
            if field in self._header:
                col = pl.col(names[self._header.index(field)])
                text = pl.when(col.str.len_bytes() > 0).then(col)
            else:
                text = pl.lit(None, dtype=pl.String)
            k: Any
            if j == 0:
                k = pl.when(text.is_null()).then(MISSING).otherwise(STRING)
                i = pl.lit(None, dtype=pl.Int64)
                x = pl.lit(None, dtype=pl.Float64)
            elif j == 1:
                as_int = pl.when(text.str.contains(_TIME_INT_TEXT)).then(
                    text.cast(pl.Int64, strict=False)
                )
                k = pl.when(text.is_null()).then(MISSING).when(as_int.is_not_null()).then(INT)
                k = k.otherwise(STRING)
                i, x = as_int, pl.lit(None, dtype=pl.Float64)
            else:
                as_int = pl.when(text.str.contains(_INT_TEXT)).then(
                    text.cast(pl.Int64, strict=False)
                )
                as_float = pl.when(text.str.contains(_FLOAT_TEXT)).then(
                    text.cast(pl.Float64, strict=False)
                )
                k = (
                    pl.when(text.is_null())
                    .then(MISSING)
                    .when(as_int.is_not_null())
                    .then(INT)
                    .when(as_float.is_not_null())
                    .then(FLOAT)
                    .otherwise(STRING)
                )
                i, x = as_int, as_float
            exprs += [
                k.cast(pl.Int8).alias(f"k{j}"),
                i.alias(f"i{j}"),
                x.alias(f"x{j}"),
                text.alias(f"t{j}"),
            ]
        return exprs
