"""Columnar typing, and block reading for text files, shared by the file sources.

Every source first *classifies* each needed field of each record into four
columns (``j`` is the field's role index in :func:`roles`: 0 key, 1 time,
then the value fields):

========  =======  ===========================================================
``k{j}``  Int8     kind: 0 missing/null, 1 integer, 2 other number, 3 string,
                   4 boolean, 5 object/array (or anything else)
``i{j}``  Int64    the value when the kind is 1
``x{j}``  Float64  the value when the kind is 2
``t{j}``  String   text: the decimal text (kind 1), the number as written or
                   formatted (kind 2), the string itself (3), ``true``/
                   ``false`` (4), JSON text (5); may be null where unused
========  =======  ===========================================================

plus ``__off`` (offset) and, optionally, ``__braw`` (the text a bad record
shows; without it :class:`Typer` asks a lookup for the bad records' texts
only). :class:`Typer` then turns those columns
into the events and bad records of ``_base``; the rules live there once, for
every format: they depend on each value only, never on the chunk.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import polars as pl
import pyarrow as pa

from ..errors import SourceChangedError, SourceError
from ._base import (
    BAD_SCHEMA,
    KEY,
    KEY_IS_INT,
    MAX_TIME_MS,
    OFFSET,
    RAW,
    TIME,
    Chunk,
    FieldPlan,
    PartitionPosition,
    RawSpan,
    RawTexts,
    dec_col,
    float_col,
    int_col,
    json_col,
)
from ._decimal import decimal_columns

I64Array = npt.NDArray[np.int64]

MISSING, INT, FLOAT, STRING, BOOL, OTHER = 0, 1, 2, 3, 4, 5

ISO_RE = (
    r"^(?P<y>[0-9]{4})-(?P<mo>[0-9]{2})-(?P<d>[0-9]{2})"
    r"(?:[Tt ](?P<h>[0-9]{2}):(?P<mi>[0-9]{2})(?::(?P<s>[0-9]{2})(?:[.,](?P<fr>[0-9]+))?)?"
    r"(?P<tz>[Zz]|[+-][0-9]{2}(?::?[0-9]{2})?)?)?$"
)
INT_RE = r"^-?[0-9]+$"
_MS_PER_DAY = 86_400_000


def roles(plan: FieldPlan) -> list[str]:
    """The field behind each classified column set: key (0), time (1), then the
    value fields in sorted order (2, 3, ...). A name may appear twice."""
    return [plan.key, plan.time, *sorted(plan.fields)]


def cls_schema(n_fields: int) -> dict[str, pl.DataType]:
    schema: dict[str, pl.DataType] = {OFFSET: pl.Int64()}
    for j in range(n_fields):
        schema[f"k{j}"] = pl.Int8()
        schema[f"i{j}"] = pl.Int64()
        schema[f"x{j}"] = pl.Float64()
        schema[f"t{j}"] = pl.String()
    return schema


def empty_events(plan: FieldPlan) -> pl.DataFrame:
    return pl.DataFrame(schema=plan.event_schema())


def no_texts(offsets: I64Array) -> pl.Series:
    """The text lookup of a block without records."""
    if len(offsets):
        raise KeyError("no record has a text in an empty block")
    return pl.Series(RAW, [], dtype=pl.String)


def empty_bad() -> pl.DataFrame:
    return pl.DataFrame(schema=BAD_SCHEMA)


def bad_frame(
    offsets: list[int], lines: list[int], reasons: list[str], raws: list[str]
) -> pl.DataFrame:
    return pl.DataFrame(
        {"_offset": offsets, "_line": lines, "_reason": reasons, "_raw": raws}, schema=BAD_SCHEMA
    )


def json_str(expr: pl.Expr) -> pl.Expr:
    """JSON-encode a String expression (quotes and escapes); null stays null."""
    encoded = (
        pl.struct(expr.alias("v"))
        .struct.json_encode()
        .str.strip_prefix('{"v":')
        .str.strip_suffix("}")
    )
    return pl.when(expr.is_not_null()).then(encoded)


def json_text(expr: pl.Expr, dtype: pl.DataType) -> pl.Expr | None:
    """The JSON text of a key value of type ``dtype`` (``7``, ``7.5``, ``true``,
    ``"u1"``); null where the value is null or a float is not finite. None for a
    type a key cannot have."""
    if dtype.is_integer():
        return expr.cast(pl.Int64, strict=False).cast(pl.String)
    if dtype.is_float():
        return pl.when(expr.is_finite()).then(expr.cast(pl.String))
    if dtype == pl.Boolean:
        return pl.when(expr).then(pl.lit("true")).when(~expr).then(pl.lit("false"))
    if dtype == pl.String:
        return json_str(expr)
    return None


def compound_key_text(fields: tuple[str, ...], values: list[pl.Expr]) -> pl.Expr:
    """The text of a compound key from each field's JSON text (``values``, in field
    order): ``"tenant":"acme","user":7``, the members of a JSON object without its
    braces (a result line is ``{`` + it + the window and aggregates). Null when a
    value is null."""
    parts: list[pl.Expr] = []
    for n, (f, value) in enumerate(zip(fields, values, strict=True)):
        parts += [pl.lit(("," if n else "") + json.dumps(f) + ":"), value]
    return pl.concat_str(parts)


def iso_ms(text: pl.Series) -> pl.Series:
    """ISO-8601 date-times -> Int64 ms since the epoch; null where not ISO-8601.

    ``YYYY-MM-DD`` optionally followed by ``T`` (or ``t``, or a space) and
    ``HH:MM[:SS[.frac]]`` (``,`` also separates the fraction) and ``Z`` (``z``)
    or ``+HH:MM``/``+HHMM``/``+HH``; no offset means UTC; the fraction is
    truncated to ms; a date alone is midnight UTC. Years 0001-9999; month, day
    (leap years included), hour, minute, second and offset ranges are checked.
    """
    g = text.str.extract_groups(ISO_RE).struct.unnest()
    c = pl.col
    y, mo, d = c("y").cast(pl.Int64), c("mo").cast(pl.Int64), c("d").cast(pl.Int64)
    h = c("h").cast(pl.Int64).fill_null(0)
    mi = c("mi").cast(pl.Int64).fill_null(0)
    s = c("s").cast(pl.Int64).fill_null(0)
    fr = c("fr").str.slice(0, 3).str.pad_end(3, "0").cast(pl.Int64).fill_null(0)
    tz = c("tz")
    tz_sign = pl.when(tz.str.starts_with("-")).then(-1).otherwise(1)
    tz_h = pl.when(tz.str.len_bytes() >= 3).then(tz.str.slice(1, 2).cast(pl.Int64)).otherwise(0)
    tz_m = pl.when(tz.str.len_bytes() >= 5).then(tz.str.slice(-2, 2).cast(pl.Int64)).otherwise(0)
    leap = ((y % 4 == 0) & (y % 100 != 0)) | (y % 400 == 0)
    dim = (
        pl.when(mo == 2)
        .then(pl.when(leap).then(29).otherwise(28))
        .when(mo.is_in([4, 6, 9, 11]))
        .then(30)
        .otherwise(31)
    )
    valid = (
        (y >= 1)
        & mo.is_between(1, 12)
        & d.is_between(1, dim)
        & (h <= 23)
        & (mi <= 59)
        & (s <= 59)
        & (tz_h.fill_null(0) <= 23)
        & (tz_m.fill_null(0) <= 59)
    )
    # days from civil (Howard Hinnant), valid for years >= 1
    yy = y - (mo <= 2).cast(pl.Int64)
    era = yy // 400
    yoe = yy - era * 400
    mp = (mo + 9) % 12
    doy = (153 * mp + 2) // 5 + d - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    days = era * 146097 + doe - 719468
    ms = (
        days * _MS_PER_DAY
        + h * 3_600_000
        + mi * 60_000
        + s * 1000
        + fr
        - tz_sign * (tz_h.fill_null(0) * 60 + tz_m.fill_null(0)) * 60_000
    )
    return g.select(pl.when(valid).then(ms).alias("iso")).to_series()


def py_classify(value: Any) -> tuple[int, int | None, float | None, str | None]:
    """Classify one decoded JSON value (the slow path for ambiguous rows)."""
    if value is None:
        return MISSING, None, None, None
    if isinstance(value, bool):
        return BOOL, None, None, "true" if value else "false"
    if isinstance(value, int):
        if -(2**63) <= value < 2**63:
            return INT, value, None, str(value)
        return FLOAT, None, float(value), str(value)
    if isinstance(value, float):
        return FLOAT, None, value, json.dumps(value)
    if isinstance(value, str):
        return STRING, None, None, value
    return OTHER, None, None, json.dumps(value, ensure_ascii=False)


def _json_repr(j: int) -> pl.Expr:
    """The value of field ``j`` as JSON text, for messages."""
    k, t = pl.col(f"k{j}"), pl.col(f"t{j}")
    return (
        pl.when(k == STRING)
        .then(json_str(t))
        .when(k == INT)
        .then(pl.coalesce(t, pl.col(f"i{j}").cast(pl.String)))
        .when(k == FLOAT)
        .then(pl.coalesce(t, pl.col(f"x{j}").cast(pl.String)))
        .otherwise(t)
    )


class Typer:
    """Classified records -> (events, bad records), for one plan.

    The polars expressions are built once per plan (building them costs more
    than running them on a small block).
    """

    def __init__(self, plan: FieldPlan, line_delta: int) -> None:
        self.plan = plan
        self.line_delta = line_delta
        jk, jt = 0, 1
        value_j = {name: 2 + n for n, name in enumerate(sorted(plan.fields))}
        kk, kt, xt = pl.col(f"k{jk}"), pl.col(f"k{jt}"), pl.col(f"x{jt}")
        it = pl.col(f"i{jt}")
        whole = (kt == FLOAT) & (xt == xt.floor())
        time_expr: Any = pl.when((kt == INT) & it.is_between(-MAX_TIME_MS, MAX_TIME_MS)).then(it)
        time_expr = time_expr.when(whole & (xt.abs() <= MAX_TIME_MS)).then(
            xt.cast(pl.Int64, strict=False)
        )
        out_of_range = ((kt == INT) & ~it.is_between(-MAX_TIME_MS, MAX_TIME_MS)) | (
            whole & (xt.abs() > MAX_TIME_MS)
        )
        self._time = time_expr.otherwise(None).alias(TIME)
        self._time_iso = (
            time_expr.when(kt == STRING).then(pl.col("__iso")).otherwise(None).alias(TIME)
        )
        if plan.derived_time:  # the transform derives it (and judges it)
            self._time = self._time_iso = pl.lit(None, dtype=pl.Int64).alias(TIME)
        bad_mask = pl.lit(False)
        if not plan.derived_key:
            bad_mask = bad_mask | (kk == MISSING)
        if not plan.derived_time:
            bad_mask = bad_mask | pl.col(TIME).is_null()
        # a decimal field's text (the number as written), then its exact value and
        # what is wrong with it: columns added to the block by __call__
        self._decimal_texts: list[tuple[int, int, int, pl.Expr]] = []
        decimals: dict[str, tuple[pl.Expr, pl.Expr, pl.Expr, pl.Expr]] = {}
        for name, (precision, scale) in plan.decimals.items():
            j = value_j[name]
            text: pl.Expr = pl.when(pl.col(f"k{j}") == INT).then(
                pl.coalesce(pl.col(f"t{j}"), pl.col(f"i{j}").cast(pl.String))
            ).when(pl.col(f"k{j}").is_in([FLOAT, STRING])).then(pl.col(f"t{j}"))
            self._decimal_texts.append((j, precision, scale, text))
            decimals[name] = (pl.col(f"__dv{j}"),
                              pl.col(f"__dn{j}") | (pl.col(f"k{j}") >= BOOL),
                              pl.col(f"__db{j}"), pl.col(f"__dt{j}"))
        for name in sorted(plan.fields):
            if name in decimals:
                bad_mask = bad_mask | decimals[name][1] | decimals[name][2]
            elif plan.fields[name] == "numeric":
                bad_mask = bad_mask | (pl.col(f"k{value_j[name]}") >= STRING)
        self._bad_mask = bad_mask
        self._events: list[pl.Expr] = [
            pl.col(OFFSET),
            (pl.lit(None, dtype=pl.String) if plan.derived_key else pl.col(f"t{jk}")).alias(KEY),
            (pl.lit(False) if plan.derived_key else kk == INT).alias(KEY_IS_INT),
            pl.col(TIME),
        ]
        self._json_fields: dict[int, tuple[int, pl.Expr]] = {}
        for name in sorted(plan.fields):
            j = value_j[name]
            k = pl.col(f"k{j}")
            if name in decimals:
                self._events.append(decimals[name][0].alias(dec_col(name)))
                continue
            self._events.append(pl.when(k == INT).then(pl.col(f"i{j}")).alias(int_col(name)))
            self._events.append(pl.when(k == FLOAT).then(pl.col(f"x{j}")).alias(float_col(name)))
            if plan.fields[name] == "any":
                s_expr: Any = pl.when(k >= BOOL).then(pl.col(f"t{j}"))
                plain = s_expr.otherwise(None).cast(pl.String).alias(json_col(name))
                with_str = (
                    s_expr.when(k == STRING)
                    .then(json_str(pl.col(f"t{j}")))
                    .otherwise(None)
                    .cast(pl.String)
                    .alias(json_col(name))
                )
                self._json_fields[len(self._events)] = (j, with_str)
                self._events.append(plain)
        reason: Any = (
            pl.when((kk == MISSING) & pl.lit(not plan.derived_key))
            .then(pl.lit(f"missing key field {plan.key!r}"))
            .when((kt == MISSING) & pl.lit(not plan.derived_time))
            .then(pl.lit(f"missing time field {plan.time!r}"))
            .when(pl.col(TIME).is_null() & out_of_range & pl.lit(not plan.derived_time))
            .then(
                pl.concat_str(
                    pl.lit(f"time field {plan.time!r} is out of range (at most 2**61 ms "
                           "either side of the epoch): "),
                    _json_repr(jt),
                )
            )
            .when(pl.col(TIME).is_null() & pl.lit(not plan.derived_time))
            .then(
                pl.concat_str(
                    pl.lit(f"time field {plan.time!r} is not an integer or ISO-8601 string: "),
                    _json_repr(jt),
                )
            )
        )
        for name in sorted(plan.fields):
            if name in decimals:
                precision, scale = plan.decimals[name]
                _, not_number, too_big, written = decimals[name]
                reason = reason.when(not_number).then(pl.concat_str(
                    pl.lit(f"field {name!r} is not a decimal number: "),
                    _json_repr(value_j[name]))).when(too_big).then(pl.concat_str(
                        pl.lit(f"field {name!r} does not fit decimal({precision}, {scale}) "
                               "(never rounded): "), written))
            elif plan.fields[name] == "numeric":
                j = value_j[name]
                reason = reason.when(pl.col(f"k{j}") >= STRING).then(
                    pl.concat_str(pl.lit(f"non-numeric value in field {name!r}: "), _json_repr(j))
                )
        self._bad = [
            pl.col(OFFSET).alias("_offset"),
            (pl.col(OFFSET) + line_delta).alias("_line"),
            reason.otherwise(pl.lit("bad record")).alias("_reason"),
            pl.col("__braw").alias("_raw"),
        ]

    def __call__(
        self, cls: pl.DataFrame, texts: RawTexts | None = None
    ) -> tuple[pl.DataFrame, pl.DataFrame]:
        """Events and bad records of ``cls``, both in its order.

        A bad record shows its text: the ``__braw`` column of ``cls`` if it has
        one, else ``texts`` of its offset (asked only for the bad ones).
        """
        if cls.height and (cls["k1"] == STRING).any():
            cls = cls.with_columns(iso_ms(cls["t1"]).alias("__iso"))
            cls = cls.with_columns(self._time_iso)
        else:
            cls = cls.with_columns(self._time)
        for j, precision, scale, text in self._decimal_texts:
            texts_j = cls.select(text).to_series()
            parts = decimal_columns(texts_j, precision, scale)
            cls = cls.with_columns(parts.get_column("value").alias(f"__dv{j}"),
                                   parts.get_column("not_number").alias(f"__dn{j}"),
                                   parts.get_column("too_big").alias(f"__db{j}"),
                                   texts_j.alias(f"__dt{j}"))
        bad_mask = cls.select(self._bad_mask).to_series()
        if bad_mask.any():
            good, bad_rows = cls.filter(~bad_mask), cls.filter(bad_mask)
        else:
            good, bad_rows = cls, None
        exprs = list(self._events)
        for at, (j, with_str) in self._json_fields.items():
            if good.height and (good[f"k{j}"] == STRING).any():
                exprs[at] = with_str
        events = good.select(exprs)
        if bad_rows is None:
            return events, pl.DataFrame(schema=BAD_SCHEMA)
        if "__braw" not in bad_rows.columns:
            if texts is None:
                raise ValueError("Typer: classified records need __braw or a texts lookup")
            offs = bad_rows[OFFSET].to_numpy().astype(np.int64, copy=False)
            bad_rows = bad_rows.with_columns(texts(offs).alias("__braw"))
        return events, bad_rows.select(self._bad).cast(BAD_SCHEMA)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------
# Line-oriented files (JSONL, CSV): blocks of bytes, chunks, positions.
# ---------------------------------------------------------------------------

DEFAULT_BLOCK_BYTES = 8 << 20
FIRST_BLOCK_BYTES = 1 << 20
TAIL_BYTES = 4096
PARSE_AHEAD = 2
_PROBE_BYTES = 1 << 16
"""Blocks of one reader being parsed in the background, beyond the one served."""

_POOL: ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()


def parse_pool() -> ThreadPoolExecutor:
    """The threads that parse blocks (numpy and polars release the GIL while they
    work, so parsing runs beside the engine on the other cores)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            workers = max(2, min(4, os.cpu_count() or 2))
            _POOL = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="sealstream-parse")
        return _POOL


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def changed_while_read(name: str, path: Path, what: str) -> SourceChangedError:
    """The error of a partition whose file changed while this run read it."""
    where = "" if name == str(path) else f" ({str(path)!r})"
    return SourceChangedError(
        f"partition {name!r}{where} changed while it was read: {what}; the run stops before "
        "anything read after the change is committed - restore the file and run again "
        "(it resumes from its last checkpoint), or replay into an isolated destination"
    )


def stat_same_file(name: str, path: Path, fd: int, file_id: tuple[int, int]) -> os.stat_result:
    """The ``fstat`` of the open file ``fd`` of partition ``name``, after checking
    that ``path`` still names it (``file_id`` is its ``(st_dev, st_ino)`` at open):
    :class:`SourceChangedError` when it was removed, renamed or replaced."""
    try:
        st = os.fstat(fd)
        at_path = os.stat(path)
    except FileNotFoundError:
        raise changed_while_read(name, path, "the file was removed or renamed") from None
    except OSError as e:
        raise SourceError(f"cannot read {str(path)!r}: {e.strerror or e}") from e
    if (at_path.st_dev, at_path.st_ino) != file_id:
        raise changed_while_read(name, path,
                                 "its path now names another file (replaced or rotated)")
    return st


def changed_error(name: str, position: PartitionPosition, what: str) -> SourceChangedError:
    return SourceChangedError(
        f"partition {name!r} changed since its checkpoint at offset {position.offset} "
        f"(byte {position.byte_offset}): {what}; resuming would skip or repeat records - "
        "replay from an earlier position into an isolated destination instead"
    )


@dataclass
class ParsedBlock:
    """A block of whole lines, parsed and typed; chunks are slices of it."""

    events: pl.DataFrame
    bad: pl.DataFrame
    rec_off: I64Array
    """Offsets of the records (good and bad), ascending."""
    rec_end: I64Array
    """Absolute byte position just after each record's line (its newline included)."""
    end_line: int
    """Offset of the first line after the block's consumable lines."""
    end_byte: int
    """Absolute byte position of that line (a trailing partial blank line is left)."""
    newlines: int
    """Newline bytes in the block (physical lines it completes)."""
    buf: bytes
    start_byte: int
    prev_tail: bytes
    texts: RawTexts
    """The raw JSON text of the block's events, by offset."""
    cursor: int = 0
    ev_off: I64Array = field(init=False)
    bad_off: I64Array = field(init=False)

    def __post_init__(self) -> None:
        self.ev_off = self.events[OFFSET].to_numpy().astype(np.int64, copy=False)
        self.bad_off = self.bad["_offset"].to_numpy().astype(np.int64, copy=False)

    def tail_before(self, byte: int) -> bytes:
        r = byte - self.start_byte
        if r >= TAIL_BYTES:
            return self.buf[r - TAIL_BYTES : r]
        return (self.prev_tail + self.buf[:r])[-TAIL_BYTES:]


Typed = tuple[pl.DataFrame, pl.DataFrame, RawTexts]
"""A block's events, bad records and the text lookup of its records."""


@dataclass(frozen=True)
class BlockLines:
    """A block of whole lines cut into records, by :meth:`LineFileReader._lines`."""

    buf: bytes
    a: npt.NDArray[np.uint8]
    """``buf`` as an array."""
    starts: I64Array
    """Where each line starts in ``buf`` (a record's first line, when one spans several)."""
    stops: I64Array
    """Where each line (record) stops in ``buf``, just after its newline."""
    rec_idx: I64Array
    """The lines that are records (not blank), ascending."""
    rec_off: I64Array
    """The offsets of those records."""
    end_line: int
    """Lines from the block's first one to the first after its consumable lines."""
    end_byte: int
    """Bytes from the block's start to that line (a trailing partial blank line is left)."""
    newlines: int
    """Newline bytes in the block (physical lines it completes)."""


def strip_eol(line: bytes) -> bytes:
    """A line without its newline and one carriage return before it."""
    if line.endswith(b"\n"):
        line = line[:-1]
    return line[:-1] if line.endswith(b"\r") else line


def valid_utf8(buf: bytes, a: npt.NDArray[np.uint8]) -> bool:
    """Whether ``buf`` (``a``: the same bytes as an array) is valid UTF-8; ASCII
    is seen without decoding."""
    if a.max() >= 0x80:
        try:
            buf.decode("utf-8")
        except UnicodeDecodeError:
            return False
    return True


def text_lengths(a: npt.NDArray[np.uint8], starts: I64Array, stops: I64Array) -> I64Array:
    """The length of each line ``a[starts[i]:stops[i]]`` without its newline and
    one carriage return before it."""
    lens = stops - starts
    lens -= a[stops - 1] == 10
    lens -= (lens > 0) & (a[np.maximum(starts + lens - 1, 0)] == 13)
    return lens


def line_spans(a: npt.NDArray[np.uint8]) -> tuple[I64Array, I64Array, int, bool]:
    """Line starts and stops (stop = after the newline) of a block, complete
    line count, and whether a final line lacks its newline."""
    nl = np.flatnonzero(a == 10).astype(np.int64)
    starts = np.empty(len(nl) + 1, np.int64)
    starts[0] = 0
    starts[1:] = nl + 1
    partial = len(a) > int(starts[-1])
    if partial:
        stops = np.append(nl + 1, np.int64(len(a)))
    else:
        starts = starts[:-1]
        stops = nl + 1
    return starts, stops, len(nl), partial


def nonblank_mask(
    a: npt.NDArray[np.uint8], starts: I64Array, stops: I64Array
) -> npt.NDArray[np.bool_]:
    """True for lines holding a byte other than space, tab, CR or LF."""
    n = len(starts)
    if n == 0:
        return np.zeros(0, np.bool_)
    has = stops > starts
    first = np.zeros(n, np.uint8)
    first[has] = a[starts[has]]
    ws_first = (first == 32) | (first == 9) | (first == 13) | (first == 10)
    out: npt.NDArray[np.bool_] = has & ~ws_first
    cand = has & ws_first
    if cand.any():
        ws = (a == 32) | (a == 9) | (a == 13) | (a == 10)
        cs = np.zeros(len(a) + 1, np.int64)
        np.cumsum(~ws, out=cs[1:])
        out[cand] = (cs[stops[cand]] - cs[starts[cand]]) > 0
    return out


def string_views(
    buf: bytes, a: npt.NDArray[np.uint8], starts: I64Array, lens: I64Array
) -> pl.Series:
    """A String Series of ``buf[starts[i] : starts[i] + lens[i]]``, zero-copy.

    Builds Arrow string-view structs with numpy (16 bytes each: length, then
    the bytes inline when at most 12, else a 4-byte prefix, buffer 0, offset).
    ``buf`` must be valid UTF-8.
    """
    n = len(starts)
    v = np.zeros((n, 4), np.int32)
    v[:, 0] = lens
    if n:
        # prefix (or inline bytes) from byte gathers; reading past a string's end
        # is harmless for long strings and masked for short ones
        last = len(a) - 1
        prefix = np.zeros(n, np.uint32)
        for b in range(4):
            prefix |= a[np.minimum(starts + b, last)].astype(np.uint32) << np.uint32(8 * b)
        v[:, 1] = prefix.view(np.int32)
        v[:, 3] = starts
        short = np.flatnonzero(lens <= 12)
        if len(short):
            pos = starts[short][:, None] + np.arange(12)
            g = a[np.minimum(pos, last)]
            g[np.arange(12)[None, :] >= lens[short][:, None]] = 0
            v.view(np.uint8)[short, 4:16] = g
    arr = pa.Array.from_buffers(pa.string_view(), n, [None, pa.py_buffer(v), pa.py_buffer(buf)])
    # through the Arrow C interface: polars' pyarrow path would import pyarrow.compute
    return pl.Series(_ArrowCapsule(arr))


class _ArrowCapsule:
    """Exposes only ``__arrow_c_array__`` of a pyarrow array."""

    def __init__(self, arr: pa.Array) -> None:
        self._arr = arr

    def __arrow_c_array__(self, requested_schema: object | None = None) -> tuple[object, object]:
        return self._arr.__arrow_c_array__(requested_schema)  # type: ignore[no-any-return]


def first_bytes(s: pl.Series) -> npt.NDArray[np.uint8]:
    """The first byte of each string of a String Series (0 for empty or null)."""
    arr = s.rechunk().to_arrow(compat_level=pl.CompatLevel.newest())
    if not pa.types.is_string_view(arr.type):
        arr = arr.cast(pa.string_view())
    views = np.frombuffer(arr.buffers()[1], np.uint8).reshape(-1, 16)[
        arr.offset : arr.offset + len(arr)
    ]
    out = np.where(views[:, :4].view(np.int32)[:, 0] > 0, views[:, 4], 0).astype(np.uint8)
    if arr.null_count:
        out[np.asarray(arr.is_null(), dtype=np.bool_)] = 0
    return out


@dataclass
class _RawBlock:
    """A block of whole records: its bytes, or (``buf`` None) ``length`` bytes at
    ``start`` that the parse thread reads itself."""

    buf: bytes | None
    start: int
    final: bool
    prev_tail: bytes
    length: int = 0


class LineFileReader:
    """Reads a text file in blocks of whole lines and serves chunks of records.

    Subclasses implement :meth:`_lines` and :meth:`_type_block` (and may
    override :meth:`_cut`, :meth:`_start`, :meth:`_prepare`). Offsets count
    lines from the start of the file (from ``position.offset`` when resuming); a
    chunk holds at most ``max_records`` records (blank lines between them do not
    count).

    The file must not change while it is read, except by growing (what is
    appended after it was opened is left for a later run). Before every chunk
    it serves, including the last, the reader checks that the file's path
    still names the file it opened (device and inode), that the file is not
    shorter than when it was opened and that its first bytes are the same; a
    block read short is a change too. A change raises
    :class:`SourceChangedError` naming the file, so no record read after the
    change ever reaches a batch.

    A final line without a newline is a record when ``read_unterminated`` is
    True (a bounded file is finished: many files lack the final newline); its
    chunk's position then ends inside that line, and a resume after the file
    grew continues only if the line had in fact ended there (the next bytes
    are its newline), else it refuses (:meth:`_start`). With
    ``read_unterminated`` False (for a file that is still being written) such a
    line is never read: the position stays at its start.
    """

    line_delta = 1

    def __init__(
        self,
        name: str,
        path: Path,
        plan: FieldPlan,
        position: PartitionPosition | None = None,
        block_bytes: int = DEFAULT_BLOCK_BYTES,
        read_unterminated: bool = True,
    ) -> None:
        self.name = name
        self._path = path
        self._plan = plan
        self._roles = roles(plan)
        self._schema = cls_schema(len(self._roles))
        self._typer = Typer(plan, self.line_delta)
        self._read_unterminated = read_unterminated
        self._block_bytes = max(1, block_bytes)
        # the first blocks are small, so that the first batch does not wait for a
        # whole block of every partition to parse; they double up to block_bytes
        self._cut_bytes = min(self._block_bytes, FIRST_BLOCK_BYTES)
        try:
            self._f = open(path, "rb")  # noqa: SIM115 - closed by close()
            st = os.fstat(self._f.fileno())
        except OSError as e:
            raise SourceError(f"cannot read {str(path)!r}: {e.strerror or e}") from e
        self._size = st.st_size
        self._file_id = (st.st_dev, st.st_ino)
        self._queue: deque[ParsedBlock] = deque()
        self._ahead: deque[Future[ParsedBlock]] = deque()
        self._raw_done = False
        self._last_block: ParsedBlock | None = None
        self._finished = False
        self._pending = b""
        self._skip_partial = False
        try:
            self._head = self._pread(0, TAIL_BYTES)
            line, byte = self._start(position)
        except BaseException:
            self._f.close()
            raise
        self._start_line, self._start_byte = line, byte
        self._tail = self._pread(max(0, byte - TAIL_BYTES), min(TAIL_BYTES, byte))
        self._start_tail = self._tail
        self._raw_byte, self._read_pos = byte, byte
        self._lines_after: Future[int] = Future()  # offset of the line after the cut blocks
        self._lines_after.set_result(line)
        self._consumed = byte
        self._f.seek(byte)

    # -- hooks -------------------------------------------------------------
    def _start(self, position: PartitionPosition | None) -> tuple[int, int]:
        """Verify ``position`` and return ``(line offset, byte)`` to read from."""
        if position is None or (position.byte_offset == 0 and not position.identity):
            return (position.offset if position else 0), 0
        self.verify(position)
        bo = position.byte_offset
        if bo > 0 and self._pread(bo - 1, 1) != b"\n":
            # the position ends a final line that had no newline when it was read (a
            # bounded run takes it as a record): that record is exact only if the line
            # did end there, i.e. the file has not grown or goes on with the newline
            after = self._pread(bo, 2)
            if after and not after.startswith((b"\n", b"\r\n")) and after != b"\r":
                raise changed_error(
                    self.name,
                    position,
                    "the line ending there had no newline when it was read and has grown "
                    "since (it was still being written), so its record was read incomplete",
                )
            self._skip_partial = True  # that newline belongs to the consumed record
        return position.offset, bo

    def _cut(self, data: bytes, prefix: bytes) -> int:
        """Length of the longest prefix of ``data`` that ends a record (0 if none);
        ``prefix`` (starting at a record boundary) comes right before ``data``."""
        return data.rfind(b"\n") + 1

    def _prepare(self, head: Callable[[int], bytes]) -> Any:
        """Called on the reading thread, in block order, as each block is cut
        (``head(n)``: the block's first n bytes); the result is passed to
        :meth:`_parse_block`, which runs on a parse thread, possibly beside the
        parsing of the reader's other blocks."""
        return None

    def _lines(self, buf: bytes, a: npt.NDArray[np.uint8], first_line: int) -> BlockLines:
        """The lines and records of a block of whole lines (the last one may lack
        its newline) whose first line has offset ``first_line``."""
        raise NotImplementedError

    def _type_block(self, block: BlockLines, prepared: Any) -> Typed:
        """The events, bad records and text lookup of a block's records (at least
        one); ``prepared`` is what :meth:`_prepare` returned for the block."""
        raise NotImplementedError

    def _parse_block(
        self,
        buf: bytes,
        start_byte: int,
        first_line: int,
        final: bool,
        prev_tail: bytes,
        prepared: Any,
    ) -> ParsedBlock:
        block = self._lines(buf, np.frombuffer(buf, np.uint8), first_line)
        if len(block.rec_idx) == 0:
            events, bad = empty_events(self._plan), empty_bad()
            texts: RawTexts = no_texts
        else:
            events, bad, texts = self._type_block(block, prepared)
        return ParsedBlock(
            events,
            bad,
            block.rec_off,
            start_byte + block.stops[block.rec_idx],
            first_line + block.end_line,
            start_byte + block.end_byte,
            block.newlines,
            buf,
            start_byte,
            prev_tail,
            texts,
        )

    # -- identity ----------------------------------------------------------
    def _changed(self, what: str) -> SourceChangedError:
        return changed_while_read(self.name, self._path, what)

    def _check_unchanged(self) -> None:
        """Raise :class:`SourceChangedError` when the file changed since it was
        opened: its path names another file (replaced, rotated), it is shorter
        (truncated), or its first bytes differ (truncated and written again, as
        a copytruncate rotation does). Growing is not a change."""
        st = stat_same_file(self.name, self._path, self._f.fileno(), self._file_id)
        if st.st_size < self._size:
            raise self._changed(
                f"it was truncated to {st.st_size} bytes (it had {self._size} when opened)"
            )
        if self._pread(0, len(self._head)) != self._head:
            raise self._changed(
                "its first bytes differ (rewritten, or truncated and written again)"
            )

    def _pread(self, at: int, n: int) -> bytes:
        if n <= 0:
            return b""
        try:
            return os.pread(self._f.fileno(), n, at)
        except OSError as e:
            raise SourceError(f"cannot read {str(self._path)!r}: {e.strerror or e}") from e

    def identity(self, byte: int, tail: bytes) -> dict[str, Any]:
        return {
            "prefix_bytes": byte,
            "head_sha256": _sha(self._head[: min(TAIL_BYTES, byte)]),
            "tail_sha256": _sha(tail),
        }

    def verify(self, position: PartitionPosition) -> None:
        """Raise :class:`SourceChangedError` unless the consumed prefix is intact."""
        bo = position.byte_offset
        if bo > self._size:
            raise changed_error(
                self.name, position, f"the file is now {self._size} bytes, shorter than that"
            )
        if not position.identity:
            return
        tail = self._pread(max(0, bo - TAIL_BYTES), min(TAIL_BYTES, bo))
        now = self.identity(bo, tail)
        got = position.identity
        if got.get("prefix_bytes") != bo:
            raise changed_error(self.name, position, "the checkpoint's identity does not match it")
        if got.get("head_sha256") != now["head_sha256"]:
            raise changed_error(
                self.name, position, "the file's first bytes differ (replaced or rotated)"
            )
        if got.get("tail_sha256") != now["tail_sha256"]:
            raise changed_error(self.name, position, "the bytes before that position differ")

    # -- reading -----------------------------------------------------------
    def _next_raw(self) -> bool:
        """Queue the next parsed block; False at end of file.

        Blocks are cut here, in order, and parsed on the parse threads, up to
        :data:`PARSE_AHEAD` of them ahead of the one being served. A block's
        first line offset is known when it is cut (its newlines are counted),
        so blocks parse independently; an error parsing one is raised here,
        when the reader reaches it.
        """
        while len(self._ahead) < PARSE_AHEAD + 1 and not self._raw_done:
            raw = self._cut_block()
            if raw is None:
                self._raw_done = True
                break
            lines_before, self._lines_after = self._lines_after, Future()
            self._ahead.append(
                parse_pool().submit(
                    self._parse_task,
                    raw,
                    lines_before,
                    self._lines_after,
                    self._prepare(functools.partial(self._block_head, raw)),
                )
            )
        if not self._ahead:
            return False
        blk = self._ahead.popleft().result()
        self._last_block = blk
        self._queue.append(blk)
        return True

    def _parse_task(
        self,
        raw: _RawBlock,
        lines_before: Future[int],
        lines_after: Future[int],
        prepared: Any,
    ) -> ParsedBlock:
        """Parse one block on a parse thread. Its first line's offset comes from
        the block before (which counts its newlines first thing), so blocks
        parse side by side; the count is handed on even if parsing fails."""
        try:
            buf = raw.buf if raw.buf is not None else self._read_block(raw)
            first_line = lines_before.result()
            lines_after.set_result(first_line + buf.count(b"\n"))
        except BaseException as e:
            if not lines_after.done():
                lines_after.set_exception(e)
            raise
        return self._parse_block(buf, raw.start, first_line, raw.final, raw.prev_tail, prepared)

    def _read_block(self, raw: _RawBlock) -> bytes:
        buf = self._pread(raw.start, raw.length)
        if len(buf) != raw.length:
            raise self._changed(
                f"it ends at byte {raw.start + len(buf)}, it had {self._size} when opened "
                "(truncated)"
            )
        return buf

    def _block_head(self, raw: _RawBlock, n: int) -> bytes:
        """The first ``n`` bytes of a block (at most its length)."""
        if raw.buf is not None:
            return raw.buf[:n]
        return self._pread(raw.start, min(n, raw.length))

    def _cut_block(self) -> _RawBlock | None:
        """Read on to the next block of whole records, or None at end of file."""
        direct = self._direct_block()
        if direct is not None:
            return direct
        while True:
            if self._read_pos >= self._size:
                if not self._pending:
                    return None
                if self._read_unterminated:
                    buf, self._pending = self._pending, b""
                    return self._raw(buf, final=True)
                # a final line without newline may still be being written: leave it
                cut = self._cut(self._pending, b"")
                if cut == 0:
                    return None
                buf, self._pending = self._pending[:cut], self._pending[cut:]
                return self._raw(buf, final=False)
            want = max(self._cut_bytes - len(self._pending), len(self._pending), 1)
            want = min(want, self._size - self._read_pos)
            try:
                data = self._f.read(want)
            except OSError as e:
                raise SourceError(f"cannot read {str(self._path)!r}: {e.strerror or e}") from e
            if not data:
                raise self._changed(
                    f"it ends at byte {self._read_pos}, it had {self._size} when opened "
                    "(truncated)"
                )
            self._read_pos += len(data)
            if self._skip_partial:
                nl = data.find(b"\n")
                skipped = data if nl < 0 else data[: nl + 1]
                data = b"" if nl < 0 else data[nl + 1 :]
                self._skip_partial = nl < 0
                self._raw_byte += len(skipped)
                self._tail = (self._tail + skipped)[-TAIL_BYTES:]
            if len(self._pending) + len(data) < self._cut_bytes and self._read_pos < self._size:
                self._pending += data
                continue
            cut = self._cut(data, self._pending)
            if cut == 0:  # no record ends in this data: read on
                self._pending += data
                continue
            buf = b"".join((self._pending, memoryview(data)[:cut]))
            self._pending = data[cut:]
            return self._raw(buf, final=False)

    def _direct_block(self) -> _RawBlock | None:
        """The next block read in one ``pread`` that ends at its last newline, when
        records end at every newline (the default :meth:`_cut`) and nothing is
        pending; None to take the general path. A small read of the block's end
        finds the cut; the parse thread reads the block (so the reading thread
        never copies a block's bytes)."""
        if (
            type(self)._cut is not LineFileReader._cut
            or self._pending
            or self._skip_partial
            or self._size - self._read_pos <= self._cut_bytes
        ):
            return None
        end = self._read_pos + self._cut_bytes
        probe = self._pread(
            max(self._read_pos, end - _PROBE_BYTES), min(_PROBE_BYTES, end - self._read_pos)
        )
        nl = probe.rfind(b"\n")
        if nl < TAIL_BYTES:  # no newline, or too little before it for the tail: read it all
            return None
        cut = end - len(probe) + nl + 1
        length = cut - self._read_pos
        raw = _RawBlock(None, self._raw_byte, False, self._tail, length)
        self._cut_bytes = min(self._block_bytes, 2 * self._cut_bytes)
        self._raw_byte += length
        self._tail = probe[nl + 1 - TAIL_BYTES : nl + 1]
        self._read_pos = cut
        self._f.seek(cut)
        return raw

    def _raw(self, buf: bytes, final: bool) -> _RawBlock:
        self._cut_bytes = min(self._block_bytes, 2 * self._cut_bytes)
        raw = _RawBlock(buf, self._raw_byte, final, self._tail)
        self._raw_byte += len(buf)
        tail = self._tail
        self._tail = buf[-TAIL_BYTES:] if len(buf) >= TAIL_BYTES else (tail + buf)[-TAIL_BYTES:]
        return raw

    def _front(self) -> ParsedBlock | None:
        """The first block with records not yet served, reading on as needed."""
        while True:
            while self._queue and self._queue[0].cursor >= len(self._queue[0].rec_off):
                self._queue.popleft()
            if self._queue:
                return self._queue[0]
            if not self._next_raw():
                return None

    def _end_position(self) -> PartitionPosition:
        blk = self._last_block
        if blk is None:
            byte, line, tail = self._start_byte, self._start_line, self._start_tail
        else:
            byte, line, tail = blk.end_byte, blk.end_line, blk.tail_before(blk.end_byte)
        return PartitionPosition(line, byte, self.identity(byte, tail))

    def next_chunk(self, max_records: int) -> Chunk | None:
        if max_records < 1:
            raise ValueError(f"max_records must be at least 1, got {max_records}")
        if self._finished:
            return None
        blk = self._front()
        # after the records were read and before any is served: a change (even one
        # the reads could not see, as a truncated file written again) stops here
        self._check_unchanged()
        if blk is None:
            self._finished = True
            pos = self._end_position()
            self._consumed = pos.byte_offset
            return Chunk(empty_events(self._plan), empty_bad(), None, pos, eof=True)
        c = blk.cursor
        k = min(max_records, len(blk.rec_off) - c)
        lo, hi = int(blk.rec_off[c]), int(blk.rec_off[c + k - 1])
        e0 = int(np.searchsorted(blk.ev_off, lo, side="left"))
        e1 = int(np.searchsorted(blk.ev_off, hi, side="right"))
        b0 = int(np.searchsorted(blk.bad_off, lo, side="left"))
        b1 = int(np.searchsorted(blk.bad_off, hi, side="right"))
        events = blk.events.slice(e0, e1 - e0)
        bad = blk.bad.slice(b0, b1 - b0)
        blk.cursor = c + k
        end = int(blk.rec_end[c + k - 1])
        pos = PartitionPosition(hi + 1, end, self.identity(end, blk.tail_before(end)))
        eof = False
        if blk.cursor >= len(blk.rec_off) and self._front() is None:
            eof = True
            self._finished = True
            pos = self._end_position()
        self._consumed = pos.byte_offset
        return Chunk(events, bad, hi, pos, eof, RawSpan(lo, hi, blk.texts))

    def size_hint(self) -> tuple[int, int] | None:
        return self._consumed, self._size

    def close(self) -> None:
        for fut in self._ahead:
            fut.cancel()
        self._ahead.clear()
        self._f.close()
