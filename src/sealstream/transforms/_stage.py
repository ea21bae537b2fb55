"""Applying a compiled transform to a batch of events, on columns.

Events carry each value field as typed columns (``__i:`` integer, ``__f:`` float,
``__s:`` JSON text of anything else; see :mod:`sealstream.sources._base`). An
expression needs one column per field with one type, so the batch is split by
*type signature*: the kind of each input field's value (null, integer, float,
string, boolean, other JSON). Usually there is one signature, sometimes a few;
each is evaluated as one Polars frame whose columns have the natural types
(Int64, Float64, String, Boolean; other JSON values as their text). So a record's
result depends on its own values only, never on the batch it arrived in.

A null value takes the type that lets the expressions type-check (String first,
then Float64, Int64, Boolean), so ``lower(region)`` of a null region is null.

A record whose values make an expression fail (a type that does not fit, a cast
that fails) is bad, its reason naming the setting and the expression. A
signature that fails to type-check makes all its records bad at once; a
failure that depends on values is narrowed down by halving the rows.

Results go back into the event columns: a derived field becomes ``__i:``/
``__f:``/``__s:`` columns like a source field (integers, floats, JSON text of
strings and booleans; dates and date-times as ms since the epoch), a derived key
becomes ``__key``/``__kint``, a derived time ``__t`` (an integer, a date-time,
or an ISO-8601 string), a count_if condition a 0/1 integer, and the filter's
verdict the boolean ``__keep`` (null counts as false, as in SQL ``WHERE``).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

import polars as pl

from sealstream.sources._base import (
    KEY,
    KEY_IS_INT,
    MAX_TIME_MS,
    OFFSET,
    PARTITION,
    TIME,
    FieldPlan,
    float_col,
    int_col,
    json_col,
)
from sealstream.transforms._compile import KEEP, CompiledTransform, Step

_NULL, _INT, _FLOAT, _STR, _BOOL, _OTHER = range(6)
_NULL_TYPES: tuple[pl.DataType, ...] = (pl.String(), pl.Float64(), pl.Int64(), pl.Boolean())
_ROW = "__row"
_N = "__n"
_MAX_COMBOS = 64

FAILED_SCHEMA: dict[str, pl.DataType] = {
    PARTITION: pl.Int32(), "_offset": pl.Int64(), "_reason": pl.String(),
}


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


@dataclass
class TransformStage:
    """Runs ``tf`` over batches whose value columns follow ``source`` (the source's
    field plan). ``numeric`` names derived fields that a numeric aggregate reads
    (a non-number there makes the record bad); ``key``/``time`` are the pipeline's
    key and time fields (derived or not)."""

    tf: CompiledTransform
    source: FieldPlan
    numeric: frozenset[str]
    key: str | tuple[str, ...]
    time: str
    _types: dict[int, tuple[dict[str, pl.DataType], tuple[Step, str] | None]] = field(
        default_factory=dict
    )

    # ------------------------------------------------------------------ public
    def apply(self, events: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
        """``(events with the transform's columns, failed records)``: failed ones have
        ``__p``, ``_offset`` and ``_reason``; events keep their order."""
        inputs = self.tf.inputs
        if not events.height:
            return self._empty(events), pl.DataFrame(schema=FAILED_SCHEMA)
        sig_expr = pl.lit(0, dtype=pl.Int64)
        for j, f in enumerate(inputs):
            sig_expr = sig_expr + self._kind(f) * (6**j)
        sig = events.select(sig_expr.alias("s")).to_series()
        signatures = sig.unique().sort().to_list()
        outs: list[pl.DataFrame] = []
        failed: list[pl.DataFrame] = []
        single = len(signatures) == 1
        base = events if single else events.with_row_index(_ROW)
        for s in signatures:
            part = base if single else base.filter(sig == s)
            good, bad = self._run_signature(part, int(s))
            outs.append(good)
            failed.append(bad)
        out = outs[0] if len(outs) == 1 else pl.concat(outs, how="diagonal_relaxed")
        if not single:
            out = out.sort(_ROW).drop(_ROW)
        bad_all = pl.concat(failed, how="vertical")
        return out, bad_all

    @staticmethod
    def keep(events: pl.DataFrame) -> pl.DataFrame:
        """The events the filter keeps (all of them without a filter), without ``__keep``."""
        if KEEP not in events.columns:
            return events
        return events.filter(pl.col(KEEP)).drop(KEEP)

    # ------------------------------------------------------------------ kinds
    def _kind(self, f: str) -> pl.Expr:
        i, x = pl.col(int_col(f)), pl.col(float_col(f))
        out = pl.when(i.is_not_null()).then(_INT).when(x.is_not_null()).then(_FLOAT)
        if self.source.fields.get(f) == "any":
            s = pl.col(json_col(f))
            out = (
                out.when(s.str.starts_with('"')).then(_STR)
                .when(s.is_in(["true", "false"])).then(_BOOL)
                .when(s.is_not_null()).then(_OTHER)
            )
        return out.otherwise(_NULL).cast(pl.Int64)

    def _kinds_of(self, sig: int) -> list[int]:
        return [(sig // 6**j) % 6 for j in range(len(self.tf.inputs))]

    def _natural(self, f: str, kind: int, dtype: pl.DataType | None) -> pl.Expr:
        if kind == _INT:
            return pl.col(int_col(f)).alias(f)
        if kind == _FLOAT:
            return pl.col(float_col(f)).alias(f)
        if kind == _STR:
            return pl.col(json_col(f)).str.json_decode(pl.String).alias(f)
        if kind == _BOOL:
            return (pl.col(json_col(f)) == "true").alias(f)
        if kind == _OTHER:
            return pl.col(json_col(f)).alias(f)
        return pl.lit(None, dtype=dtype or pl.String()).alias(f)

    # ------------------------------------------------------------------ typing
    def _resolve(self, sig: int) -> tuple[dict[str, pl.DataType], tuple[Step, str] | None]:
        """The types of a signature's null fields, and the step that cannot type-check
        with any choice (with Polars' reason), cached per signature."""
        if sig in self._types:
            return self._types[sig]
        kinds = self._kinds_of(sig)
        nulls = [f for f, k in zip(self.tf.inputs, kinds, strict=True) if k == _NULL]
        combos = itertools.islice(itertools.product(_NULL_TYPES, repeat=len(nulls)), _MAX_COMBOS)
        first_error: tuple[Step, str] | None = None
        chosen: dict[str, pl.DataType] = {}
        for combo in combos:
            types = dict(zip(nulls, combo, strict=True))
            frame = self._empty_natural(kinds, types)
            error = self._check(frame)
            if error is None:
                chosen, first_error = types, None
                break
            if first_error is None:
                first_error = error
        self._types[sig] = (chosen, first_error)
        return chosen, first_error

    def _empty_natural(self, kinds: list[int], types: dict[str, pl.DataType]) -> pl.DataFrame:
        schema: dict[str, pl.DataType] = {}
        for f, k in zip(self.tf.inputs, kinds, strict=True):
            schema[f] = {
                _INT: pl.Int64(), _FLOAT: pl.Float64(), _STR: pl.String(),
                _BOOL: pl.Boolean(), _OTHER: pl.String(),
            }.get(k, types.get(f, pl.String()))
        return pl.DataFrame(schema=schema)

    def _check(self, frame: pl.DataFrame) -> tuple[Step, str] | None:
        for step in self.tf.steps:
            try:
                frame = _eval(step, frame)
            except Exception as exc:  # noqa: BLE001 - any error is the step's failure
                return step, _first_line(exc)
            if step.kind == "batch":
                continue
            if step.name not in frame.columns:
                return step, f"map_batches returned no column {step.name!r}"
            problem = _result_problem(step, frame.schema[step.name])
            if problem is not None:
                return step, problem
        return None

    # ------------------------------------------------------------------ running
    def _run_signature(self, part: pl.DataFrame, sig: int) -> tuple[pl.DataFrame, pl.DataFrame]:
        kinds = self._kinds_of(sig)
        types, error = self._resolve(sig)
        if error is not None:
            step, why = error
            return part.clear(), self._failed(part, step, why)
        natural = part.select(
            pl.int_range(pl.len(), dtype=pl.Int64).alias(_N),  # literals broadcast to it
            *(self._natural(f, k, types.get(f))
              for f, k in zip(self.tf.inputs, kinds, strict=True)),
        )
        failed: list[pl.DataFrame] = []
        ok = pl.Series("ok", [True] * part.height)
        for step in self.tf.steps:
            try:
                natural = _eval(step, natural)
                continue
            except Exception:  # noqa: BLE001 - narrowed down below
                pass
            mask, why = _failing_rows(natural, step)
            failed.append(self._failed(part.filter(mask & ok), step, why))
            ok = ok & ~mask
            natural = natural.with_columns(_eval_where(natural, step, ok))
        out, bad = self._write_back(part, natural, ok)
        if bad is not None:
            failed.append(bad)
        return out, pl.concat([pl.DataFrame(schema=FAILED_SCHEMA), *failed], how="vertical")

    def _failed(self, rows: pl.DataFrame, step: Step, why: str) -> pl.DataFrame:
        what = (f"map_batches (version {step.text!r})" if step.setting == "map_batches"
                else f"{step.setting} = {step.text!r}")
        reason = f"{what} failed: {why}"
        return rows.select(
            pl.col(PARTITION).cast(pl.Int32),
            pl.col(OFFSET).alias("_offset"),
            pl.lit(reason).alias("_reason"),
        )

    def _write_back(
        self, part: pl.DataFrame, natural: pl.DataFrame, ok: pl.Series
    ) -> tuple[pl.DataFrame, pl.DataFrame | None]:
        """The events with each result in event columns; records whose derived key or
        time is unusable, or whose derived field a numeric aggregate reads is not a
        number, are failed instead."""
        cols: list[pl.Expr] = []
        problems: list[tuple[pl.Expr, str]] = []
        for step in self.tf.steps:
            if step.kind == "batch":
                continue
            r = pl.col(step.name)
            dtype = natural.schema[step.name]
            if step.kind == "where":
                cols.append((r.fill_null(False) if dtype == pl.Boolean else pl.lit(False))
                            .alias(KEEP))
                continue
            if step.kind == "condition":
                cols.append(r.fill_null(False).cast(pl.Int64).alias(int_col(step.name)))
                continue
            i, x, s = _split(r, dtype)
            cols += [i.alias(int_col(step.name)), x.alias(float_col(step.name))]
            if step.name in self.numeric:
                problems.append((s.is_not_null(), f"{step.setting} = {step.text!r} gave a "
                                 "non-numeric value for a numeric aggregate"))
            else:
                cols.append(s.alias(json_col(step.name)))
            if step.name == self.key:
                text = pl.coalesce(i.cast(pl.String), x.cast(pl.String),
                                   _unquote(s, dtype, r))
                cols += [text.alias(KEY), i.is_not_null().alias(KEY_IS_INT)]
                problems.append((text.is_null(), f"{step.setting} = {step.text!r} gave no "
                                 f"key (null) for key field {self.key!r}"))
            if step.name == self.time:
                t = _time(r, dtype)
                cols.append(t.alias(TIME))
                problems.append((t.is_null(), f"{step.setting} = {step.text!r} gave no time "
                                 "(not an integer, a date-time or an ISO-8601 string within "
                                 f"2**61 ms of the epoch) for time field {self.time!r}"))
        if self.tf.key_fields is not None:
            text = _compound_key(natural, self.tf.key_fields)
            cols += [text.alias(KEY), pl.lit(False).alias(KEY_IS_INT)]
            problems.append((text.is_null(), "a field of the compound key "
                             f"{list(self.tf.key_fields)} is missing or null (or not a "
                             "finite number)"))
        computed = natural.select(pl.col(_N), *cols, *(c.alias(f"__bad{n}") for n, (c, _) in
                                                       enumerate(problems))).drop(_N)
        drop = [c for c in computed.columns if c in part.columns]
        out = part.drop(drop).hstack(computed.drop([f"__bad{n}" for n in range(len(problems))]))
        bad_mask = ~ok
        reasons: list[pl.DataFrame] = []
        for n, (_, why) in enumerate(problems):
            hit = computed.get_column(f"__bad{n}").fill_null(False) & ~bad_mask
            if hit.any():
                reasons.append(part.filter(hit).select(
                    pl.col(PARTITION).cast(pl.Int32), pl.col(OFFSET).alias("_offset"),
                    pl.lit(why).alias("_reason")))
                bad_mask = bad_mask | hit
        if bad_mask.any():
            out = out.filter(~bad_mask)
        return out, (pl.concat(reasons, how="vertical") if reasons else None)

    def _empty(self, events: pl.DataFrame) -> pl.DataFrame:
        """An empty batch with the columns a transformed one has."""
        add: dict[str, pl.DataType] = {}
        for step in self.tf.steps:
            if step.kind == "batch":
                continue
            if step.kind == "where":
                add[KEEP] = pl.Boolean()
            elif step.kind == "condition":
                add[int_col(step.name)] = pl.Int64()
            else:
                add[int_col(step.name)] = pl.Int64()
                add[float_col(step.name)] = pl.Float64()
                if step.name not in self.numeric:
                    add[json_col(step.name)] = pl.String()
        keep = [c for c in events.columns if c not in add]
        return events.select(keep).with_columns(
            pl.lit(None, dtype=t).alias(c) for c, t in add.items()
        )


def _compound_key(natural: pl.DataFrame, fields: tuple[str, ...]) -> pl.Expr:
    """The text of a compound key: ``"tenant":"acme","user":7`` (see
    :func:`~sealstream.sources._parse.compound_key_text`). Null when a field is null."""
    from sealstream.sources._parse import compound_key_text, json_text

    values = [json_text(pl.col(f), natural.schema[f]) for f in fields]
    return compound_key_text(fields, [pl.lit(None, dtype=pl.String) if v is None else v
                                      for v in values])


def _result_problem(step: Step, dtype: pl.DataType) -> str | None:
    if step.kind in ("where", "condition") and dtype not in (pl.Boolean, pl.Null):
        return f"a condition must be true or false, this gives {dtype}"
    if isinstance(dtype, pl.List | pl.Array | pl.Struct | pl.Object):
        return f"gives a {dtype}, not a single value"
    return None


def _eval(step: Step, frame: pl.DataFrame) -> pl.DataFrame:
    """``frame`` with the step's result column(s); raises what the step raises."""
    if step.kind == "output":  # a column map_batches wrote
        return frame
    if step.fn is not None:
        inner = frame.drop(_N) if _N in frame.columns else frame
        out = step.fn(inner)
        if not isinstance(out, pl.DataFrame) or out.height != inner.height:
            got = f"{out.height} rows" if isinstance(out, pl.DataFrame) else type(out).__name__
            raise ValueError(f"map_batches must return a DataFrame of {inner.height} rows in "
                             f"their order, got {got}")
        writes = [c for c in step.writes if c in out.columns]
        return frame.with_columns(out.select(writes)) if writes else frame
    assert step.expr is not None
    return frame.with_columns(step.expr.alias(step.name))


def _step_columns(step: Step) -> list[str]:
    return list(step.writes) if step.kind == "batch" else [step.name]


def _eval_where(natural: pl.DataFrame, step: Step, ok: pl.Series) -> list[pl.Series]:
    """The step over the rows still ok (the others null): its result columns."""
    if step.kind == "output":
        return []
    rows = _eval(step, natural.filter(ok))
    idx = pl.int_range(natural.height, eager=True).filter(ok)
    out = []
    for name in _step_columns(step):
        if name not in rows.columns:
            continue
        value = rows.get_column(name)
        full = pl.Series(name, [None] * natural.height, dtype=value.dtype)
        out.append(full.scatter(idx, value))
    return out


def _failing_rows(natural: pl.DataFrame, step: Step) -> tuple[pl.Series, str]:
    """The rows on which ``step`` fails (halving the frame), and the first reason."""
    n = natural.height
    mask = [False] * n
    reason = ""
    stack = [(0, n)]
    while stack:
        lo, hi = stack.pop()
        if lo >= hi:
            continue
        try:
            _eval(step, natural.slice(lo, hi - lo))
            continue
        except Exception as exc:  # noqa: BLE001
            if hi - lo == 1:
                mask[lo] = True
                reason = reason or _first_line(exc)
                continue
        mid = (lo + hi) // 2
        stack += [(mid, hi), (lo, mid)]
    return pl.Series("bad", mask), reason or "the expression failed"


def _split(r: pl.Expr, dtype: pl.DataType) -> tuple[pl.Expr, pl.Expr, pl.Expr]:
    """A result column as (integer, float, JSON text) columns."""
    none_i, none_f = pl.lit(None, dtype=pl.Int64), pl.lit(None, dtype=pl.Float64)
    none_s = pl.lit(None, dtype=pl.String)
    if dtype.is_integer():
        return r.cast(pl.Int64, strict=False), none_f, none_s
    if dtype.is_float():
        return none_i, r.cast(pl.Float64), none_s
    if dtype == pl.Boolean:
        text = pl.when(r).then(pl.lit("true")).when(~r).then(pl.lit("false"))
        return none_i, none_f, text.otherwise(None).cast(pl.String)
    if dtype == pl.Datetime or dtype == pl.Date:
        return r.dt.epoch("ms").cast(pl.Int64), none_f, none_s
    if dtype == pl.String:
        from sealstream.sources._parse import json_str

        return none_i, none_f, json_str(r)
    if dtype == pl.Null:
        return none_i, none_f, none_s
    return none_i, none_f, r.cast(pl.String, strict=False)


def _unquote(s: pl.Expr, dtype: pl.DataType, r: pl.Expr) -> pl.Expr:
    """A key's text: strings as they are, booleans as true/false."""
    if dtype == pl.String:
        return r
    return s


def _time(r: pl.Expr, dtype: pl.DataType) -> pl.Expr:
    """A derived time as ms since the epoch, null when unusable."""
    t: Any
    if dtype.is_integer():
        t = r.cast(pl.Int64, strict=False)
    elif dtype.is_float():
        t = pl.when(r == r.floor()).then(r.cast(pl.Int64, strict=False))
    elif dtype == pl.Datetime or dtype == pl.Date:
        t = r.dt.epoch("ms").cast(pl.Int64)
    elif dtype == pl.String:
        from sealstream.sources._parse import iso_ms

        t = r.map_batches(iso_ms, return_dtype=pl.Int64)
    else:
        return pl.lit(None, dtype=pl.Int64)
    return pl.when(t.is_between(-MAX_TIME_MS, MAX_TIME_MS)).then(t)
