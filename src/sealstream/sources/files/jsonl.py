"""JSON Lines partitions: one JSON object per line.

The good path is columnar: a block of whole lines is decoded by
``polars.read_ndjson`` with a schema holding only the fields the plan reads,
newlines and blank lines are found with numpy, and a line's text is a
zero-copy view of the block's bytes, built (without a per-line loop) only for
the rows that need it. Polars' decoder forgets the difference
between ``2`` and ``2.0`` (Float64 columns) and between ``"12"`` and ``12``
(String columns), so exactly the rows where that matters are checked against
the token as written (a regex on the line's text); rows the regex cannot settle (the
field name appears more than once in the line) are decoded with ``json``.

Each field is decoded as Int64, Float64 or String, learned from the first
lines and widened when a block holds a value that does not fit (that block is
then decoded as String); results never depend on that choice. Blocks are parsed
on the parse threads of ``_parse`` (several at once, beside the engine).

A block that polars cannot decode (invalid JSON, a line that is not an object,
invalid UTF-8) is split into groups of lines; groups that still fail are
checked line by line with ``json.loads`` to find the bad lines, and the rest
is decoded columnar again.

Known limits: an object that repeats a name may count either occurrence; the
JSON text of objects/arrays in ``__s:`` columns (and of an object used as a
key) is polars' re-serialisation (``{"a": 1}``), not the text as written;
integers outside the Int64 range are treated as floats; only space, tab and
CR make a line blank (other whitespace makes it invalid JSON).
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt
import polars as pl

from .._base import OFFSET, FieldPlan, PartitionPosition, RawTexts
from .._parse import (
    BOOL,
    FLOAT,
    INT,
    INT_RE,
    MISSING,
    OTHER,
    STRING,
    BlockLines,
    I64Array,
    LineFileReader,
    Typed,
    Typer,
    bad_frame,
    cls_schema,
    first_bytes,
    line_spans,
    nonblank_mask,
    py_classify,
    roles,
    string_views,
    strip_eol,
    text_lengths,
    valid_utf8,
)

_GROUP_LINES = 1024
_LEAF_LINES = 16  # below this, a span with a bad line is checked line by line
_TOKEN = r'"|-?[0-9]+(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?|true|false|null|\{|\['
_NUMLIKE = r"^-?[0-9]+(?:\.[0-9]+)?$"
_WS = "[ \t\r\n]*"
# polars raises ComputeError & co; a Rust panic surfaces as PanicException (a BaseException)
_POLARS_ERRORS = (Exception, pl.exceptions.PanicException)
_AMBIGUOUS_FIRST = np.frombuffer(b"-0123456789tf{[", np.uint8)
# a \uD800-\uDBFF escape not followed by a \uDC00-\uDFFF one, or the reverse (may
# also match an escaped backslash before "u": each match is checked with json)
_LONE_SURROGATE = re.compile(
    rb"\\u[dD][89abAB][0-9a-fA-F]{2}(?!\\u[dD][c-fC-F][0-9a-fA-F]{2})"
    rb"|(?<!\\u[dD][89abAB][0-9a-fA-F]{2})\\u[dD][c-fC-F][0-9a-fA-F]{2}"
)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


@functools.lru_cache(maxsize=256)
def _token_expr(name: str) -> pl.Expr:
    key = '"' + pl.escape_regex(json.dumps(name, ensure_ascii=False)[1:-1]) + '"' + _WS + ":"
    r = pl.col("r")
    return pl.when(r.str.count_matches(key) == 1).then(r.str.extract(f"{key}{_WS}({_TOKEN})", 1))


def _tokens(raw: pl.Series, name: str) -> pl.Series:
    """The first character(s) of field ``name``'s token in each raw line: ``"``
    for a string, the number as written, ``true``..., ``{`` or ``[``; null
    where the name does not occur exactly once."""
    return pl.DataFrame({"r": raw}).select(_token_expr(name)).to_series()


_TK = pl.col("tok")
_TOK_FIRST = [
    pl.when(_TK.str.contains(INT_RE)).then(_TK.cast(pl.Int64, strict=False)).alias("ai"),
    _TK.str.head(1).alias("c"),
]
_TOK_KIND = (
    pl.when(pl.col("c") == '"')
    .then(STRING)
    .when(pl.col("c").is_in(["t", "f"]))
    .then(BOOL)
    .when(pl.col("c").is_in(["{", "["]))
    .then(OTHER)
    .when(pl.col("c").is_in(list("-0123456789")) & pl.col("ai").is_not_null())
    .then(INT)
    .when(pl.col("c").is_in(list("-0123456789")))
    .then(FLOAT)
    .otherwise(None)  # no token, or "null" where polars saw a value: json settles it
    .cast(pl.Int8)
    .alias("k")
)
_K = pl.col("k")
_TOK_OUT = [
    _K,
    pl.when(_K == INT).then(pl.col("ai")).alias("i"),
    pl.when(_K == FLOAT).then(_TK.cast(pl.Float64, strict=False)).alias("x"),
    pl.when(_K == INT)
    .then(pl.col("ai").cast(pl.String))
    .when(_K == FLOAT)
    .then(_TK)
    .otherwise(pl.col("v"))
    .alias("t"),
]
_SUB_SCHEMA: dict[str, pl.DataType] = {
    "k": pl.Int8(),
    "i": pl.Int64(),
    "x": pl.Float64(),
    "t": pl.String(),
}
_V = pl.col("v")
_AMBIGUOUS = (
    _V.str.contains(_NUMLIKE)
    | _V.is_in(["true", "false"])
    | _V.str.starts_with("{")
    | _V.str.starts_with("[")
)


def _classify_tokens(values: pl.Series, tok: pl.Series) -> pl.DataFrame:
    """Classify rows from their raw token (and polars' decoded text ``values``,
    a String column, all null when the column is numeric)."""
    df = pl.DataFrame({"v": values.cast(pl.String), "tok": tok})
    return df.with_columns(_TOK_FIRST).with_columns(_TOK_KIND).select(_TOK_OUT)


Cols = dict[str, "pl.Series | None"]


Take = Callable[[I64Array], pl.Series]
"""Row positions of a decoded block -> those rows' line texts."""


def _classify_column(v: pl.Series, take: Take, name: str, need_text: bool) -> Cols:
    """The k/i/x/t columns of one decoded column (None: all null); ``take`` gives
    the line text of the rows whose token must be read as written."""
    n = v.len()
    nulls = v.is_null().to_numpy() if v.null_count() else np.zeros(n, np.bool_)
    if v.dtype == pl.Int64:
        return {
            "k": pl.Series(np.where(nulls, MISSING, INT).astype(np.int8)),
            "i": v,
            "x": None,
            "t": v.cast(pl.String) if need_text else None,
        }
    if v.dtype == pl.Float64:
        xs = v.to_numpy()
        k = np.where(nulls, MISSING, FLOAT).astype(np.int8)
        with np.errstate(invalid="ignore"):
            check = ~nulls if need_text else ~nulls & (np.floor(xs) == xs)
        rows = np.flatnonzero(check)
        cols: Cols = {"i": None, "x": v, "t": None}
        values = pl.Series(dtype=pl.String).extend_constant(None, len(rows))
    else:
        v = v.cast(pl.String)
        k = np.where(nulls, MISSING, STRING).astype(np.int8)
        cols = {"i": None, "x": None, "t": v}
        # polars writes numbers as digits, booleans as true/false, objects as {...}
        cand = np.flatnonzero(np.isin(first_bytes(v), _AMBIGUOUS_FIRST))
        values = v.gather(pl.Series(cand, dtype=pl.UInt32))
        ambiguous = pl.DataFrame({"v": values}).select(_AMBIGUOUS).to_series()
        rows = cand[ambiguous.to_numpy()]
        values = values.filter(ambiguous)
    if len(rows) == 0:
        cols["k"] = pl.Series(k)
        return cols
    sel = pl.Series(rows, dtype=pl.UInt32)
    texts = take(rows.astype(np.int64, copy=False))
    sub = _classify_tokens(values, _tokens(texts, name))
    unsettled = sub["k"].is_null().arg_true()
    if unsettled.len():
        lines = texts.gather(unsettled).to_list()
        recs = pl.DataFrame(
            [py_classify(json.loads(line).get(name)) for line in lines],
            schema=_SUB_SCHEMA,
            orient="row",
        )
        sub = sub.with_columns(sub[c].scatter(unsettled, recs[c]) for c in ("k", "i", "x", "t"))
    k[rows] = sub["k"].to_numpy()
    cols["k"] = pl.Series(k)
    for c, dtype in (("i", pl.Int64), ("x", pl.Float64), ("t", pl.String)):
        if sub[c].null_count() == len(rows):
            continue
        full = cols[c]
        if full is None:
            full = pl.Series(dtype=dtype).extend_constant(None, n)
        elif c == "x":
            full = full.clone()
        cols[c] = full.scatter(sel, sub[c])
    return cols


#: a UTF-8 byte order mark (some Windows tools open every text file with one)
UTF8_BOM = b"\xef\xbb\xbf"


class JsonlReader(LineFileReader):
    """A JSONL file as a partition. See the module docstring."""

    line_delta = 1
    _dtypes: dict[str, pl.DataType] | None = None
    """The types blocks are decoded with (see :meth:`_prepare`), once learned."""

    def _start(self, position: PartitionPosition | None) -> tuple[int, int]:
        """As a line file, skipping a UTF-8 byte order mark that opens the file (as
        the CSV reader does): line 1 is the record after it, not a bad record."""
        line, byte = super()._start(position)
        if byte == 0 and self._pread(0, 3) == UTF8_BOM:
            return line, len(UTF8_BOM)
        return line, byte

    @classmethod
    def for_values(cls, plan: FieldPlan) -> JsonlReader:
        """A parser of message values (no file): see :meth:`parse_values_block`."""
        self = cls.__new__(cls)
        self.name = "<values>"
        self._plan = plan
        self._roles = roles(plan)
        self.line_delta = 0
        self._typer = Typer(plan, 0)
        self._dtypes = None
        self._schema = cls_schema(len(self._roles))
        return self

    def parse_values_block(self, buf: bytes) -> Typed:
        """Events, bad records and the text lookup of ``buf``: one record per line,
        every line a record (no blank line), offsets = line indices."""
        dtypes = self._prepare(lambda n: buf[:n])
        block = self._parse_block(buf, 0, 0, True, b"", dtypes)
        return block.events, block.bad, block.texts

    # -- decoding ------------------------------------------------------------
    def _guess(self, lines: list[bytes]) -> dict[str, pl.DataType]:
        kinds: dict[str, set[int]] = {name: set() for name in self._roles}
        for line in lines:
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            if isinstance(obj, dict):
                for name in kinds:
                    kinds[name].add(py_classify(obj.get(name))[0])
        return {name: self._dtype_for(name, ks) for name, ks in kinds.items()}

    def _dtype_for(self, name: str, kinds: set[int]) -> pl.DataType:
        kinds = kinds - {MISSING}
        if not kinds:
            if name == self._plan.key:
                return pl.String()
            if name == self._plan.time:
                return pl.Int64()
            return pl.Float64()
        if kinds <= {INT}:
            return pl.Int64()
        if kinds <= {INT, FLOAT}:
            return pl.Float64()
        return pl.String()

    def _decode(
        self, buf: bytes, dtypes: dict[str, pl.DataType] | None = None
    ) -> tuple[pl.DataFrame, bool] | None:
        """Decode whole lines with the learned types; ``(frame, relearn)``, or
        None when polars refuses the lines (invalid JSON, not an object...).

        A value that does not fit its learned type makes polars fail with
        "cannot parse ...": the lines are then decoded with every field as
        String (always exact after :func:`_classify_column`) and the types are
        learned again from what they hold.
        """
        if dtypes is None:
            assert self._dtypes is not None
            dtypes = dict(self._dtypes)
        try:
            return pl.read_ndjson(buf, schema=dtypes), False
        except _POLARS_ERRORS as e:
            if "cannot parse" not in str(e) or all(d == pl.String for d in dtypes.values()):
                return None
        try:
            return pl.read_ndjson(buf, schema=dict.fromkeys(dtypes, pl.String())), True
        except _POLARS_ERRORS:
            return None

    def _classify(self, df: pl.DataFrame, take: Take, off: I64Array, relearn: bool) -> pl.DataFrame:
        """Decoded fields -> the classified columns of ``_parse`` (per role);
        ``take`` gives the text of rows of ``df`` by position."""
        cols: dict[str, pl.Series] = {OFFSET: pl.Series(OFFSET, off, dtype=pl.Int64)}
        all_null: list[pl.Expr] = []
        learned: dict[str, set[int]] = {}
        for j, name in enumerate(self._roles):
            # the key's text, and a decimal field's number as written (never a float)
            exact = j == 0 or (j >= 2 and name in self._plan.decimals)
            c = _classify_column(df[name], take, name, need_text=exact)
            for part in "kixt":
                series = c.get(part)
                if series is None:
                    all_null.append(
                        pl.lit(None, dtype=self._schema[f"{part}{j}"]).alias(f"{part}{j}")
                    )
                else:
                    cols[f"{part}{j}"] = series.rename(f"{part}{j}")
            if relearn:
                learned.setdefault(name, set()).update(cols[f"k{j}"].unique().to_list())
        if self._dtypes is not None:
            for name, kinds in learned.items():
                if kinds - {MISSING}:
                    self._dtypes[name] = self._dtype_for(name, kinds)
        return pl.DataFrame(cols).with_columns(all_null).select(self._schema.keys())

    # -- blocks --------------------------------------------------------------
    def _prepare(self, head: Callable[[int], bytes]) -> dict[str, pl.DataType]:
        # the types each block is decoded with, learned from the first block's
        # first lines (and widened by blocks that need it: results never depend
        # on them, only the speed does)
        if self._dtypes is None:
            self._dtypes = self._guess(head(1 << 16).split(b"\n")[:100])
        return dict(self._dtypes)

    def _lines(self, buf: bytes, a: npt.NDArray[np.uint8], first_line: int) -> BlockLines:
        starts, stops, n_complete, partial = line_spans(a)
        nonblank = nonblank_mask(a, starts, stops)
        rec_idx = np.flatnonzero(nonblank).astype(np.int64)
        if partial and nonblank[-1]:
            end_line, end_byte = len(starts), len(buf)
        else:
            end_line = n_complete
            end_byte = int(stops[n_complete - 1]) if n_complete else 0
        return BlockLines(
            buf, a, starts, stops, rec_idx, first_line + rec_idx, end_line, end_byte, n_complete
        )

    def _type_block(self, block: BlockLines, dtypes: dict[str, pl.DataType]) -> Typed:
        events, bad, texts = self._type_lines(block, dtypes)
        buf = block.buf
        # memchr for a backslash first: most blocks hold none, and a search for the
        # two bytes costs ten times more
        if events.height and (i := buf.find(b"\\")) >= 0 and buf.find(b"\\u", i) >= 0:
            events, bad = self._lone_surrogates(block, events, bad)
        return events, bad, texts

    def _lone_surrogates(
        self, block: BlockLines, events: pl.DataFrame, bad: pl.DataFrame
    ) -> tuple[pl.DataFrame, pl.DataFrame]:
        """Events whose key, time or value field holds a lone surrogate escape
        (``"\\ud800"``: no Unicode character) become bad records. Polars decodes
        such a string as another one (``"\\u0000..."``); a key must never change
        silently. Only lines the regex finds are decoded, with ``json``."""
        buf, starts, stops = block.buf, block.starts, block.stops
        rec_idx, rec_off = block.rec_idx, block.rec_off
        hits = [m.start() for m in _LONE_SURROGATE.finditer(buf)]
        if not hits:
            return events, bad
        lines = np.unique(np.searchsorted(starts, np.asarray(hits, np.int64), side="right") - 1)
        lines = lines[np.isin(lines, rec_idx)]
        offsets = rec_off[np.searchsorted(rec_idx, lines)]
        in_events = np.isin(offsets, events[OFFSET].to_numpy())
        bad_off: list[int] = []
        reasons: list[str] = []
        raws: list[str] = []
        for line, off in zip(lines[in_events].tolist(), offsets[in_events].tolist(), strict=True):
            text = strip_eol(buf[starts[line] : stops[line]])
            reason = self._surrogate_problem(text)
            if reason is not None:
                bad_off.append(off)
                reasons.append(reason)
                raws.append(text.decode("utf-8", "replace"))
        if not bad_off:
            return events, bad
        events = events.filter(~pl.col(OFFSET).is_in(pl.Series(bad_off, dtype=pl.Int64)))
        lines_1 = [o + self.line_delta for o in bad_off]
        bad = pl.concat([bad, bad_frame(bad_off, lines_1, reasons, raws)]).sort("_offset")
        return events, bad

    def _surrogate_problem(self, line: bytes) -> str | None:
        try:
            obj = json.loads(line)
        except ValueError:
            return None
        if not isinstance(obj, dict):
            return None
        for name in dict.fromkeys(self._roles):
            if name in obj and _has_surrogate(obj[name]):
                return (
                    f"field {name!r} holds a lone surrogate escape (\\ud800-\\udfff "
                    "without its pair), which is not a Unicode character"
                )
        return None

    def _type_lines(self, block: BlockLines, dtypes: dict[str, pl.DataType]) -> Typed:
        buf, a, starts, stops = block.buf, block.a, block.starts, block.stops
        rec_idx, rec_off = block.rec_idx, block.rec_off
        utf8_ok = valid_utf8(buf, a)
        if utf8_ok:
            if len(rec_idx) == len(starts):  # no blank line: spare the gathers
                rec_starts, rec_stops = starts, stops
            else:
                rec_starts, rec_stops = starts[rec_idx], stops[rec_idx]

            def take(rows: I64Array) -> pl.Series:
                # only the rows asked for: on the good path, the few whose token
                # must be read as written, and bad records (never every line)
                starts_r = rec_starts[rows]
                return string_views(buf, a, starts_r, text_lengths(a, starts_r, rec_stops[rows]))

            def texts(offsets: I64Array) -> pl.Series:
                return take(np.searchsorted(rec_off, offsets).astype(np.int64, copy=False))

            decoded = self._decode(buf, dtypes)
            if decoded is not None and decoded[0].height == len(rec_idx):
                cls = self._classify(decoded[0], take, rec_off, decoded[1])
                return (*self._typer(cls, texts), texts)
            raw = take(np.arange(len(rec_idx), dtype=np.int64))
        else:
            raw = pl.Series(
                [strip_eol(buf[starts[r] : stops[r]]).decode("utf-8", "replace") for r in rec_idx],
                dtype=pl.String,
            )
        events, bad = self._slow_block(block, raw, utf8_ok)
        return events, bad, _series_texts(raw, rec_off)

    def _slow_block(
        self, block: BlockLines, raw: pl.Series, utf8_ok: bool
    ) -> tuple[pl.DataFrame, pl.DataFrame]:
        buf, starts, stops = block.buf, block.starts, block.stops
        rec_idx, rec_off = block.rec_idx, block.rec_off
        parts: list[pl.DataFrame] = []
        bad_off: list[int] = []
        bad_reason: list[str] = []
        bad_raw: list[str] = []
        n = len(rec_idx)

        def settle(g0: int, g1: int) -> None:
            """Decode records g0..g1 column-wise, bisecting around bad lines: a span
            that fails is halved until it is small, then checked line by line."""
            if utf8_ok:
                span = buf[starts[rec_idx[g0]] : stops[rec_idx[g1 - 1]]]
                decoded = self._decode(span)
                if decoded is not None and decoded[0].height == g1 - g0:
                    if decoded[1]:  # types were relearned: classify on its own
                        parts.append(
                            self._classify(
                                decoded[0],
                                _series_take(raw.slice(g0, g1 - g0)),
                                rec_off[g0:g1],
                                True,
                            )
                        )
                    else:  # classified together below: one pass, not one per span
                        clean.append((decoded[0], g0, g1))
                    return
                if g1 - g0 > _LEAF_LINES:
                    mid = (g0 + g1) // 2
                    settle(g0, mid)
                    settle(mid, g1)
                    return
            good: list[int] = []
            for r in range(g0, g1):
                line = strip_eol(buf[starts[rec_idx[r]] : stops[rec_idx[r]]])
                reason = _line_problem(line)
                if reason is None:
                    good.append(r)
                else:
                    bad_off.append(int(rec_off[r]))
                    bad_reason.append(reason)
                    bad_raw.append(line.decode("utf-8", "replace"))
            if good:
                parts.extend(self._decode_lines(block, raw, good, bad_off, bad_reason, bad_raw))

        clean: list[tuple[pl.DataFrame, int, int]] = []
        for g0 in range(0, n, _GROUP_LINES):
            settle(g0, min(n, g0 + _GROUP_LINES))
        by_schema: dict[tuple[tuple[str, pl.DataType], ...], list[tuple[pl.DataFrame, int, int]]]
        by_schema = {}
        for item in clean:  # spans decoded with the same learned types go together
            by_schema.setdefault(tuple(item[0].schema.items()), []).append(item)
        for group in by_schema.values():
            idx = np.concatenate([np.arange(a, b) for _, a, b in group])
            parts.append(
                self._classify(
                    pl.concat([d for d, _, _ in group], how="vertical"),
                    _series_take(raw.gather(pl.Series(idx, dtype=pl.Int64))),
                    rec_off[idx],
                    False,
                )
            )
        if parts:
            cls = pl.concat(parts, how="vertical_relaxed").sort(OFFSET)
        else:
            cls = pl.DataFrame(schema=self._schema)
        events, bad = self._typer(cls, _series_texts(raw, rec_off))
        if bad_off:
            lines = [o + self.line_delta for o in bad_off]
            bad = pl.concat([bad, bad_frame(bad_off, lines, bad_reason, bad_raw)]).sort("_offset")
        return events, bad

    def _decode_lines(
        self,
        block: BlockLines,
        raw: pl.Series,
        rows: list[int],
        bad_off: list[int],
        bad_reason: list[str],
        bad_raw: list[str],
    ) -> list[pl.DataFrame]:
        """Decode lines that ``json`` accepts; lines polars still refuses are bad."""
        buf, starts, stops = block.buf, block.starts, block.stops
        rec_idx, rec_off = block.rec_idx, block.rec_off
        joined = b"\n".join(strip_eol(buf[starts[rec_idx[r]] : stops[rec_idx[r]]]) for r in rows)
        decoded = self._decode(joined)
        sel = pl.Series(rows, dtype=pl.Int64)
        if decoded is not None and decoded[0].height == len(rows):
            return [
                self._classify(decoded[0], _series_take(raw.gather(sel)), rec_off[rows], decoded[1])
            ]
        if len(rows) == 1:
            r = rows[0]
            bad_off.append(int(rec_off[r]))
            line = strip_eol(buf[starts[rec_idx[r]] : stops[rec_idx[r]]])
            problem = self._surrogate_problem(line)
            bad_reason.append(problem or "record cannot be decoded as a JSON object")
            bad_raw.append(raw[r])
            return []
        mid = len(rows) // 2
        head = self._decode_lines(block, raw, rows[:mid], bad_off, bad_reason, bad_raw)
        return head + self._decode_lines(block, raw, rows[mid:], bad_off, bad_reason, bad_raw)


def _series_take(raw: pl.Series) -> Take:
    """Row positions -> texts, from a Series of every row's text."""
    return lambda rows: raw.gather(pl.Series(rows, dtype=pl.Int64))


def _series_texts(raw: pl.Series, rec_off: I64Array) -> RawTexts:
    """Offsets -> texts, from the texts of the records at ``rec_off`` (ascending)."""
    return lambda offsets: raw.gather(pl.Series(np.searchsorted(rec_off, offsets), dtype=pl.Int64))


def _line_problem(line: bytes) -> str | None:
    """Why one line is not a JSON object, or None when it is one."""
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as e:
        return f"invalid UTF-8 at byte {e.start + 1} of the line"
    try:
        obj = json.loads(text, parse_constant=_reject_constant)
    except json.JSONDecodeError as e:
        # json's own messages can end in "at" ("Unterminated string starting at")
        msg = e.msg[:-3] if e.msg.endswith(" at") else e.msg
        return f"invalid JSON: {msg} at column {e.colno}"
    except (ValueError, RecursionError) as e:
        return f"invalid JSON: {e}"
    if not isinstance(obj, dict):
        kind = {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(
            type(obj), "a number"
        )
        return f"record is not a JSON object (it is {kind})"
    return None


def _has_surrogate(value: Any) -> bool:
    """Whether a decoded JSON value holds a lone surrogate (in a string, at any depth)."""
    if not isinstance(value, (str, list, dict)):
        return False
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False
