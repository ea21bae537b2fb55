"""The enrichment stage: each table's columns joined to a batch of events, as of
each event's time, on columns (a Polars ``join_asof`` by key, or a hash join for a
table of one version). Never a lookup per event.

Keys compare as text, as the pipeline's key does: the event field's value as
written (a JSON string unquoted, a number as its digits) against the table
column's value as text (an integer ``7`` matches ``"7"``).

Added columns become event columns like a source field's (``__i:``/``__f:``/
``__s:``, :mod:`sealstream.sources._base`), so later transforms, aggregates and
compound keys read them as if the source had them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt
import polars as pl

from sealstream.enrich._settings import Enrich
from sealstream.enrich._tables import PRESENT, VALID_FROM, Table
from sealstream.errors import BadRecordError, SourceError, SpecError
from sealstream.sources._base import (
    KEY,
    OFFSET,
    PARTITION,
    TIME,
    FieldKind,
    FieldPlan,
    float_col,
    int_col,
    json_col,
)

EKEEP = "__ekeep"
"""False on an event that a table with ``on_missing = "drop"`` has no row for."""
_ROW = "__erow"


def _key_col(i: int) -> str:
    return f"__ek{i}"


def _table_text(c: str, dtype: pl.DataType) -> pl.Expr:
    """A table column's values as key text."""
    col = pl.col(c)
    if dtype == pl.String:
        return col
    if dtype == pl.Boolean:
        return pl.when(col).then(pl.lit("true")).when(~col).then(pl.lit("false"))
    return col.cast(pl.String, strict=False)


def _event_text(f: str, kind: FieldKind | None, columns: list[str]) -> pl.Expr:
    """An event field's value as key text (null when the event lacks it)."""
    parts: list[pl.Expr] = []
    if int_col(f) in columns:
        parts.append(pl.col(int_col(f)).cast(pl.String))
    if float_col(f) in columns:
        parts.append(pl.col(float_col(f)).cast(pl.String))
    if kind == "any" and json_col(f) in columns:
        s = pl.col(json_col(f))
        parts.append(pl.when(s.str.starts_with('"'))
                     .then(s.str.json_decode(pl.String)).otherwise(s))
    return pl.coalesce(parts) if parts else pl.lit(None, dtype=pl.String)


def _typed(e: Enrich, c: str, dtype: pl.DataType, kind: FieldKind) -> list[pl.Expr]:
    """A table column as event columns: ``__i:``, ``__f:`` (and ``__s:`` for a field
    of kind ``any``)."""
    from sealstream.sources._parse import json_str

    col = pl.col(c)
    none_i, none_f = pl.lit(None, dtype=pl.Int64), pl.lit(None, dtype=pl.Float64)
    none_s = pl.lit(None, dtype=pl.String)
    if dtype.is_integer():
        i, x, s = col.cast(pl.Int64, strict=False), none_f, none_s
    elif dtype.is_float() or dtype.is_decimal():
        i, x, s = none_i, col.cast(pl.Float64), none_s
    elif dtype == pl.Null:
        i, x, s = none_i, none_f, none_s
    elif kind == "numeric":
        raise SourceError(f"enrich.{e.name}: column {c!r} holds {dtype} values, but a numeric "
                          "aggregate reads it")
    elif dtype == pl.String:
        i, x, s = none_i, none_f, json_str(col)
    elif dtype == pl.Boolean:
        i, x = none_i, none_f
        s = pl.when(col).then(pl.lit("true")).when(~col).then(pl.lit("false"))
    else:
        i, x, s = none_i, none_f, col.cast(pl.String, strict=False)
    out = [i.alias(int_col(c)), x.alias(float_col(c))]
    if kind == "any":
        out.append(s.alias(json_col(c)))
    return out


def _valid_from(e: Enrich, frame: pl.DataFrame) -> pl.Expr:
    """The ``valid_from`` column as Int64 ms (integers, ISO-8601 text, date-times)."""
    from sealstream.sources._parse import iso_ms

    assert e.valid_from is not None
    dtype = frame.schema[e.valid_from]
    col = pl.col(e.valid_from)
    if dtype.is_integer():
        return col.cast(pl.Int64)
    if dtype == pl.String:
        return col.map_batches(iso_ms, return_dtype=pl.Int64)
    if dtype == pl.Datetime or dtype == pl.Date:
        return col.dt.epoch("ms").cast(pl.Int64)
    raise SourceError(f"enrich.{e.name}: valid_from column {e.valid_from!r} holds {dtype}; "
                      "expected ms since the epoch or ISO-8601 date-times")


def _hash(n_keys: int) -> pl.Expr:
    """A 64-bit hash of the key text columns (the same on events and on the table)."""
    cols = [_key_col(i) for i in range(n_keys)]
    return (pl.col(cols[0]) if n_keys == 1 else pl.struct(cols)).hash()


@dataclass(frozen=True)
class _Index:
    """The table sorted by (key hash, valid_from) for a lookup by binary search:
    ``hashes`` the distinct key hashes, sorted (a key's code is its index there);
    ``codes`` each row's key code; ``slots`` (versioned) each row's
    ``code * span + (valid_from - low + 1)``, ascending."""

    hashes: npt.NDArray[np.uint64]
    codes: npt.NDArray[np.int64]
    slots: npt.NDArray[np.int64] | None
    low: int
    span: int


@dataclass(frozen=True)
class _Prepared:
    settings: Enrich
    frame: pl.DataFrame  # key text columns, __vf (versioned), __present, typed columns
    versioned: bool
    added: tuple[str, ...]  # the table's columns added to events
    typed: tuple[str, ...]  # the event columns those become
    #: the binary-search index (None: two keys share a hash, or the slots would
    #: overflow; the join is then Polars' join_asof or hash join)
    index: _Index | None = None


def _index(frame: pl.DataFrame, n_keys: int, versioned: bool
           ) -> tuple[pl.DataFrame, _Index | None]:
    """``frame`` sorted for the lookup, and its index (None when it cannot be used)."""
    keys = [_key_col(i) for i in range(n_keys)]
    h = frame.select(_hash(n_keys).alias("__h")).to_series()
    if h.n_unique() != frame.select(keys).n_unique():
        return frame, None  # two distinct keys with one hash: the joins handle it
    frame = frame.with_columns(h).sort(["__h", *([VALID_FROM] if versioned else [])])
    hv = frame.get_column("__h").to_numpy()
    hashes = np.unique(hv)
    codes = np.searchsorted(hashes, hv).astype(np.int64)
    frame = frame.drop("__h")
    if not versioned:
        return frame, _Index(hashes, codes, None, 0, 1)
    vf = frame.get_column(VALID_FROM).to_numpy().astype(np.int64)
    if not vf.size:
        return frame, _Index(hashes, codes, np.zeros(0, dtype=np.int64), 0, 1)
    low, high = int(vf.min()), int(vf.max())
    span = high - low + 2
    if span * (len(hashes) + 1) >= 2**62:
        return frame, None
    return frame, _Index(hashes, codes, codes * span + (vf - low + 1), low, span)


def prepare(table: Table, needed: dict[str, FieldKind]) -> _Prepared:
    """A loaded table ready to join: checked (columns present, one row per key and
    version, valid times), its keys as text, the ``needed`` columns typed."""
    e, frame = table.settings, table.frame
    have = frame.columns
    where = f"enrich.{e.name}"
    for c in (*e.on, *([e.valid_from] if e.valid_from else []), *(e.columns or ())):
        if c not in have:
            raise SourceError(f"{where}: the table has no column {c!r} (it has: "
                              f"{', '.join(have) or 'no columns'})")
    skip = {*e.on, *([e.valid_from] if e.valid_from else []), PRESENT, VALID_FROM}
    added = tuple(e.columns) if e.columns is not None else tuple(
        c for c in have if c not in skip)
    keys = [_table_text(c, frame.schema[c]).alias(_key_col(i)) for i, c in enumerate(e.on)]
    versioned = table.versioned or e.valid_from is not None
    cols: list[pl.Expr] = [*keys]
    if e.valid_from is not None:
        cols.append(_valid_from(e, frame).alias(VALID_FROM))
    elif table.versioned:
        cols.append(pl.col(VALID_FROM))
    cols.append(pl.col(PRESENT) if PRESENT in have else pl.lit(True).alias(PRESENT))
    typed: list[str] = []
    for c in added:
        if c in needed:
            exprs = _typed(e, c, frame.schema[c], needed[c])
            cols += exprs
            typed += [x.meta.output_name() for x in exprs]
    out = frame.with_row_index(_ROW, offset=1).select(pl.col(_ROW), *cols)
    if e.valid_from is not None:
        bad = out.filter(pl.col(VALID_FROM).is_null())
        if bad.height:
            raw = frame.get_column(e.valid_from)[int(bad[_ROW][0]) - 1]
            raise SourceError(f"{where}: row {bad[_ROW][0]}: valid_from {raw!r} is not ms "
                              "since the epoch or an ISO-8601 date-time")
    if not table.versioned:  # a changelog's later record replaces an earlier one
        ident = [_key_col(i) for i in range(len(e.on))] + ([VALID_FROM] if versioned else [])
        dup = out.filter(pl.struct(ident).is_duplicated())
        if dup.height:
            first = dup.row(0, named=True)
            same = pl.all_horizontal([pl.col(c) == first[c] for c in ident])
            rows = dup.filter(same)[_ROW].to_list()
            keytext = ", ".join(f"{f}={first[_key_col(i)]!r}" for i, f in enumerate(e.on))
            at = f" valid_from={first[VALID_FROM]}" if versioned else ""
            raise SourceError(f"{where}: the table holds {len(rows)} rows for {keytext}{at} "
                              f"(rows {', '.join(map(str, rows[:5]))}); a key has one row per "
                              "version")
    out = out.drop(_ROW)
    out, index = _index(out, len(e.on), versioned)
    if index is None and versioned:
        out = out.sort(VALID_FROM, maintain_order=True)
    return _Prepared(e, out, versioned, added, tuple(typed), index)


class EnrichStage:
    """Joins every ``[[enrich]]`` table, in order, to batches of events.

    ``plan`` is what the pipeline's transform and windows read from events; the
    stage takes the tables' columns out of it (:attr:`source_plan`, what the source
    must extract) and makes them itself."""

    def __init__(self, tables: list[Table], plan: FieldPlan, key_derived: bool,
                 time_derived: bool) -> None:
        if time_derived:
            raise SpecError("enrich: the event time is derived by [transform]; enrichment "
                            "runs before [transform], on the source's time field (a derived "
                            "time is not supported yet)")
        self.event_plan = plan
        needed: dict[str, FieldKind] = dict(plan.fields)
        fields = dict(plan.fields)
        made: set[str] = set()
        self.tables: list[_Prepared] = []
        self._on_kind: list[dict[str, FieldKind | None]] = []
        for t in tables:
            e = t.settings
            on_kind: dict[str, FieldKind | None] = {}
            for f in e.on:
                if f in made or f in plan.fields:  # an added column, or a source field
                    on_kind[f] = needed.get(f, "any")
                elif f == plan.key and not plan.derived_key:
                    on_kind[f] = None  # the key column
                elif f == plan.key and key_derived:
                    raise SpecError(f"enrich.{e.name}.on: {f!r} is the key derived by "
                                    "[transform]; enrichment runs before [transform]")
                else:
                    fields.setdefault(f, "any")
                    needed.setdefault(f, "any")
                    on_kind[f] = "any"
            prepared = prepare(t, needed)
            for c in prepared.added:
                made.add(c)
                fields.pop(c, None)
            self.tables.append(prepared)
            self._on_kind.append(on_kind)
        self.source_plan = replace(plan, fields=fields)
        #: table name -> its version (set by :func:`sealstream.enrich.open_stage`)
        self.versions: dict[str, dict[str, object]] = {}
        self.drops = any(p.settings.on_missing == "drop" for p in self.tables)

    def apply(self, events: pl.DataFrame, names: list[str]) -> pl.DataFrame:
        """``events`` with every table's columns (and ``__ekeep`` when a table drops
        unmatched events); BadRecordError naming the partition and offset of the
        first event without a row in a table with ``on_missing = "error"``."""
        if self.drops:
            events = events.with_columns(pl.lit(True).alias(EKEEP))
        for prepared, on_kind in zip(self.tables, self._on_kind, strict=True):
            events, missing = self._join(events, prepared, on_kind)
            how = prepared.settings.on_missing
            if how == "error":
                self._refuse(events, missing, prepared, names)
            elif how == "drop":
                events = events.with_columns((pl.col(EKEEP) & ~missing).alias(EKEEP))
            events = events.drop(PRESENT, *(_key_col(i) for i in range(len(on_kind))))
        return events

    @staticmethod
    def not_dropped(failed: pl.DataFrame, events: pl.DataFrame) -> pl.DataFrame:
        """Of the records a transform failed on (``__p``, ``_offset``), those that no
        table drops: an event dropped for want of a row is not also a bad record."""
        if EKEEP not in events.columns or not failed.height:
            return failed
        dropped = events.filter(~pl.col(EKEEP)).select(
            pl.col(PARTITION).cast(failed.schema[PARTITION]), pl.col(OFFSET).alias("_offset"))
        return failed.join(dropped, on=[PARTITION, "_offset"], how="anti",
                           maintain_order="left")

    @staticmethod
    def keep(events: pl.DataFrame) -> pl.DataFrame:
        """The events no table drops, without ``__ekeep`` (after the watermark)."""
        if EKEEP not in events.columns:
            return events
        return events.filter(pl.col(EKEEP)).drop(EKEEP)

    def _join(self, events: pl.DataFrame, t: _Prepared, on_kind: dict[str, FieldKind | None]
              ) -> tuple[pl.DataFrame, pl.Expr]:
        cols = events.columns
        keys = [_key_col(i) for i in range(len(t.settings.on))]
        texts = [(pl.col(KEY) if kind is None else _event_text(f, kind, cols)).alias(k)
                 for (f, kind), k in zip(on_kind.items(), keys, strict=True)]
        events = events.drop([c for c in t.typed if c in cols])
        left = events.with_columns(texts)
        if t.index is not None:
            return self._lookup(left, t, t.index), ~pl.col(PRESENT)
        right = t.frame
        if t.versioned:
            left = left.with_row_index(_ROW).sort(TIME)
            joined = left.join_asof(right, left_on=TIME, right_on=VALID_FROM, by=keys,
                                    strategy="backward", check_sortedness=False)
            joined = joined.sort(_ROW).drop(_ROW, VALID_FROM)
        else:
            joined = left.join(right, on=keys, how="left", maintain_order="left")
        missing = ~pl.col(PRESENT).fill_null(False)
        return joined, missing

    @staticmethod
    def _lookup(left: pl.DataFrame, t: _Prepared, ix: _Index) -> pl.DataFrame:
        """The join by binary search: each event's key hash -> its code; with
        versions, the last row of that code whose slot is not after the event's
        (its time clipped to the table's range); then the row's key texts are
        compared with the event's, so a hash that two keys share never joins."""
        n_keys = len(t.settings.on)
        keys = [_key_col(i) for i in range(n_keys)]
        h = left.select(_hash(n_keys)).to_series().to_numpy()
        if not ix.hashes.size:
            row = np.full(h.shape, -1, dtype=np.int64)
        else:
            code = np.minimum(np.searchsorted(ix.hashes, h), ix.hashes.size - 1)
            found = ix.hashes[code] == h
            if ix.slots is None:
                row = np.where(found, code, -1)
            else:
                tt = left.get_column(TIME).to_numpy()
                clipped = np.clip(tt, ix.low - 1, ix.low + ix.span - 2) - ix.low + 1
                at = np.searchsorted(ix.slots, code * ix.span + clipped, side="right") - 1
                ok = found & (at >= 0) & (ix.codes[np.maximum(at, 0)] == code)
                row = np.where(ok, at, -1)
        idx = pl.Series("__i", row, dtype=pl.Int64)
        idx = pl.select(pl.when(idx >= 0).then(idx).cast(pl.UInt32)).to_series()
        got = t.frame.select(pl.all().gather(idx))
        same = pl.all_horizontal([pl.col(k).eq(pl.col(f"__e{k}")) for k in keys])
        got = got.with_columns(left.select(keys).rename({k: f"__e{k}" for k in keys}))
        present = got.select((pl.col(PRESENT) & same).fill_null(False)).to_series()
        if (present != got.get_column(PRESENT).fill_null(False)).any():  # a shared hash
            got = got.with_columns(pl.when(present).then(pl.col(c)).alias(c) for c in t.typed)
        got = got.with_columns(present.alias(PRESENT))
        drop = [*keys, *(f"__e{k}" for k in keys), *([VALID_FROM] if t.versioned else [])]
        return left.hstack(got.drop(drop))

    def _refuse(self, events: pl.DataFrame, missing: pl.Expr, t: _Prepared,
                names: list[str]) -> None:
        hit = events.filter(missing)
        if not hit.height:
            return
        first = hit.row(0, named=True)
        name = names[first[PARTITION]] if PARTITION in first else "?"
        key = ", ".join(f"{f}={first[_key_col(i)]!r}" for i, f in enumerate(t.settings.on))
        raise BadRecordError(
            f"{name}: offset {first[OFFSET]}: enrich.{t.settings.name}: the reference table "
            f"has no row for {key} valid at the event's time {first[TIME]} ms "
            "(on_missing = \"error\")")
