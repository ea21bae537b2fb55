"""Aggregates as mergeable accumulators over columns.

Each aggregate of the contract (count, sum, min, max, mean, first, last) is
kept as a few accumulator columns that can be computed from a batch of
events (:meth:`Accumulators.partial`) and merged with the window state
(:meth:`Accumulators.combine`) in any grouping, then turned into the final
value (:meth:`Accumulators.finalize`). Because merging is associative, the
result does not depend on how events were split into batches.

Typing rules (per value, so per window, never per batch):

* integers and floats are accumulated apart: a sum is an integer when every
  value it met was an integer, and a float as soon as one float took part;
* min/max return the winning value with its own type;
* mean is always a float;
* first/last pick the non-null value with the smallest/largest
  ``(event time, arrival sequence)``; the arrival sequence is the position in
  the global read order, so ties go to the record read first/last;
* nulls (and missing fields) are ignored; an aggregate over only nulls is null;
* a field declared ``decimal(P, S)`` (``plan.decimals``) is exact: its sum, min and
  max are kept as Int128 counts of ``10**-S`` units (``#sd:``, ``#nd:``,
  ``#mind:``, ``#maxd:``), a sum has scale S, a mean scale ``max(S, 6)`` rounded
  half away from zero (HALF_UP, as Flink's AVG over DECIMAL); the result line
  writes them as JSON strings with exactly that many fraction digits (``"12.50"``)
  and the typed column is a Polars Decimal.

Accumulator columns start with ``#``; window identity columns are
``__key``, ``__kint``, ``window_start``, ``window_end``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from sealstream.aggspec import Aggregate, condition_field
from sealstream.pipeline.types import mean_scale
from sealstream.sources._base import (
    KEY,
    KEY_IS_INT,
    TIME,
    FieldPlan,
    dec_col,
    float_col,
    int_col,
    json_col,
)
from sealstream.sources._decimal import unscaled_text
from sealstream.sources._parse import json_str
from sealstream.windows import sketches

SEQ = "__seq"
WSTART = "window_start"
WEND = "window_end"
GROUP = [KEY, KEY_IS_INT, WSTART, WEND]
COUNT = "#n"
LIST_STATES = ("#cd:", "#hll:", "#qv:")
"""Accumulators holding a list per window (distinct values, sketch codes, values)."""


def _float_json(expr: pl.Expr) -> pl.Expr:
    """JSON text of a float column: finite values as polars prints them, else null."""
    return pl.when(expr.is_finite()).then(expr.cast(pl.String)).otherwise(pl.lit("null"))


# a character that JSON text of a string could escape (all but printable ASCII
# without '"' and '\\'): keys without one are their own JSON text, quoted
_NOT_PLAIN = r"[^\x20-\x21\x23-\x5b\x5d-\x7e]"


def _json_string(expr: pl.Expr) -> pl.Expr:
    """JSON-escape a string column (with quotes)."""
    return (
        pl.struct(expr.alias("k"))
        .struct.json_encode()
        .str.strip_prefix('{"k":')
        .str.strip_suffix("}")
    )


_MAX_KEY_WORDS = 8


def key_words(frame: pl.DataFrame) -> list[np.ndarray] | None:
    """The key's UTF-8 bytes as big-endian uint64 words, zero-padded, most
    significant first; None when keys are too long for that to pay off."""
    longest = frame.select(pl.col(KEY).str.len_bytes().max()).item()
    n_words = max(1, -(-int(longest or 0) // 8))
    if n_words > _MAX_KEY_WORDS:
        return None
    # pad with NUL characters (at least one byte each) to at least 8 * n_words bytes
    padded = pl.col(KEY).str.pad_end(8 * n_words, "\x00").cast(pl.Binary)
    words = frame.select(
        padded.bin.slice(8 * i, 8)
        .bin.reinterpret(dtype=pl.UInt64, endianness="big")
        .alias(f"w{i}")
        for i in range(n_words)
    )
    return [words.get_column(f"w{i}").to_numpy() for i in range(n_words)]


def take(frame: pl.DataFrame, idx: np.ndarray) -> pl.DataFrame:
    """``frame[idx]``, gathering plain numeric columns with numpy (faster)."""
    cols = []
    for col in frame.iter_columns():
        if col.dtype in (pl.Int64, pl.Float64) and not col.null_count():
            cols.append(pl.Series(col.name, col.to_numpy()[idx], dtype=col.dtype))
        else:
            cols.append(col.gather(idx))
    return pl.DataFrame(cols)


def _narrow(x: np.ndarray) -> np.ndarray:
    """``x`` shifted into uint16 when its range allows (numpy radix-sorts those)."""
    if x.dtype.kind in "biu" and x.size:
        lo, hi = int(x.min()), int(x.max())
        if hi - lo < 2**16:
            return (x - lo).astype(np.uint16) if x.dtype.kind != "b" else x.astype(np.uint8)
    return x


#: from this many elements on, a wide integer key is sorted by Polars (multi-threaded)
#: rather than NumPy's single-threaded stable sort (radix for 8/16-bit keys, which
#: stays with NumPy: it is faster than either)
PARALLEL_SORT_MIN = 1 << 15


def stable_argsort(k: np.ndarray) -> np.ndarray:
    """The stable permutation sorting ``k`` (ties keep their order)."""
    if k.size < PARALLEL_SORT_MIN or k.dtype.itemsize <= 2 or k.dtype.kind not in "iu":
        return np.argsort(k, kind="stable")
    order = pl.DataFrame({"k": k}).select(pl.arg_sort_by("k", maintain_order=True))
    out: np.ndarray = order.to_series().to_numpy().astype(np.intp, copy=False)
    return out


def lex_order(keys: list[np.ndarray]) -> np.ndarray:
    """Stable permutation sorting by ``keys`` (most significant first)."""
    order: np.ndarray | None = None
    for key in reversed(keys):
        k = _narrow(key if order is None else key[order])
        step = stable_argsort(k)
        order = step if order is None else order[step]
    assert order is not None
    return order


def result_order(frame: pl.DataFrame) -> np.ndarray:
    """The permutation sorting rows by ``(window_end, window_start, key text)``
    (byte order, as Polars compares strings). Rows equal in all three (which
    firing never produces) come out in an unspecified order.

    Integer sorts only: the key text is compared through its bytes as uint64
    words (plus its length when a key holds a NUL byte, the padding).
    """
    words = key_words(frame)
    if words is None:
        order = frame.select(pl.arg_sort_by(KEY, maintain_order=True)).to_series().to_numpy()
    else:
        if frame.select(pl.col(KEY).str.contains("\x00", literal=True).any()).item():
            words.append(frame.get_column(KEY).str.len_bytes().to_numpy())
        # one word: np.argsort's default sort (faster than a stable one), so rows
        # equal in key and window may swap; firing gives one row per window
        order = np.argsort(words[0]) if len(words) == 1 else lex_order(words)
    we = frame.get_column(WEND).to_numpy()[order]
    ws = frame.get_column(WSTART).to_numpy()[order]
    e_lo, s_lo = int(we.min()), int(ws.min())
    e_span, s_span = int(we.max()) - e_lo + 1, int(ws.max()) - s_lo + 1
    if e_span * s_span < 2**62:
        code = (we - e_lo) * s_span + (ws - s_lo)
        step = int(np.gcd.reduce(code))
        second = lex_order([code // step if step > 1 else code])
    else:
        second = lex_order([we, ws])
    out: np.ndarray = order[second]
    return out


def in_result_order(frame: pl.DataFrame) -> bool:
    """True when rows are sorted by ``(window_end, window_start, key text)``."""
    e, s, k = pl.col(WEND), pl.col(WSTART), pl.col(KEY)
    pe, ps, pk = e.shift(1), s.shift(1), k.shift(1)
    ok = (e > pe) | ((e == pe) & ((s > ps) | ((s == ps) & (k >= pk))))
    return bool(frame.select(ok.fill_null(True).all()).item())


def _format(parts: list[str | pl.Expr]) -> pl.Expr:
    """Text and String expressions joined row by row (null when one is null):
    ``pl.format`` on a template, about a third faster than ``concat_str``."""
    template = "".join(
        p.replace("{", "{{").replace("}", "}}") if isinstance(p, str) else "{}" for p in parts
    )
    return pl.format(template, *(p for p in parts if not isinstance(p, str)))


@dataclass(frozen=True)
class Accumulators:
    """The accumulator layout for a list of aggregates."""

    aggregates: tuple[Aggregate, ...]
    plan: FieldPlan
    #: a compound key: ``__key`` is the fields' JSON (``"tenant":"a","user":1``), each
    #: shown under its own name in the result line
    named_key: bool = False

    # ---------------------------------------------------------------- layout
    def _uses(self, func: str, fld: str) -> bool:
        return any(a.func == func and a.field == fld for a in self.aggregates)

    def _fields(self, *funcs: str) -> list[str]:
        """The non-decimal fields ``funcs`` read."""
        return sorted({a.field for a in self.aggregates if a.func in funcs and a.field
                       and a.field not in self.plan.decimals})

    def _decimals(self, *funcs: str) -> list[str]:
        """The decimal fields ``funcs`` read."""
        return sorted({a.field for a in self.aggregates if a.func in funcs and a.field
                       and a.field in self.plan.decimals})

    def needs_order(self) -> bool:
        """True when first/last need events sorted by (time, sequence)."""
        return any(a.func in ("first", "last") for a in self.aggregates)

    def _conditions(self) -> list[str]:
        return sorted(condition_field(a.name) for a in self.aggregates if a.func == "count_if")

    def input_columns(self) -> list[str]:
        """The event columns the partial aggregations read."""
        cols: list[str] = []
        for f in sorted({a.field for a in self.aggregates if a.field}):
            cols += self._value_cols(f)
        cols += [int_col(c) for c in self._conditions()]
        return cols

    def schema(self) -> dict[str, pl.DataType]:
        s: dict[str, pl.DataType] = {COUNT: pl.Int64()}
        for f in self._fields("sum", "mean"):
            s[f"#si:{f}"] = pl.Int128()  # exact: int64 values can sum past int64
            s[f"#sf:{f}"] = pl.Float64()
            s[f"#ni:{f}"] = pl.Int64()
            s[f"#nf:{f}"] = pl.Int64()
        for f in self._fields("min"):
            s[f"#mini:{f}"] = pl.Int64()
            s[f"#minf:{f}"] = pl.Float64()
        for f in self._fields("max"):
            s[f"#maxi:{f}"] = pl.Int64()
            s[f"#maxf:{f}"] = pl.Float64()
        for tag, func in (("f", "first"), ("l", "last")):
            for f in self._fields(func):
                s[f"#{tag}t:{f}"] = pl.Int64()
                s[f"#{tag}q:{f}"] = pl.Int64()
                s[f"#{tag}i:{f}"] = pl.Int64()
                s[f"#{tag}f:{f}"] = pl.Float64()
                if self.plan.fields.get(f) == "any":
                    s[f"#{tag}s:{f}"] = pl.String()
        for f in self._fields("count_distinct"):
            s[f"#cd:{f}"] = pl.List(pl.String())
        for f in self._fields("approx_count_distinct"):
            s[f"#hll:{f}"] = pl.List(pl.UInt32())
        for f in self._fields("median", "quantile"):
            s[f"#qv:{f}"] = pl.List(pl.Float64())
        for f in self._fields("stddev", "variance"):
            s[f"#vn:{f}"] = pl.Int64()
            s[f"#vm:{f}"] = pl.Float64()
            s[f"#vq:{f}"] = pl.Float64()
        for c in self._conditions():
            s[f"#ci:{c}"] = pl.Int64()
        for f in self._decimals("sum", "mean"):
            s[f"#sd:{f}"] = pl.Int128()
            s[f"#nd:{f}"] = pl.Int64()
        for f in self._decimals("min"):
            s[f"#mind:{f}"] = pl.Int128()
        for f in self._decimals("max"):
            s[f"#maxd:{f}"] = pl.Int128()
        return s

    def _value_cols(self, f: str) -> list[str]:
        if f in self.plan.decimals:
            return [dec_col(f)]
        cols = [int_col(f), float_col(f)]
        if self.plan.fields.get(f) == "any":
            cols.append(json_col(f))
        return cols

    # ---------------------------------------------------------------- partial
    def partial(self) -> list[pl.Expr]:
        """Aggregations over events grouped by window.

        For first/last the events must already be sorted by (``__t``, ``__seq``).
        """
        out: list[pl.Expr] = [pl.len().cast(pl.Int64).alias(COUNT)]
        for f in self._fields("sum", "mean"):
            i, fl = pl.col(int_col(f)), pl.col(float_col(f))
            out += [
                i.cast(pl.Int128).sum().alias(f"#si:{f}"),
                fl.sum().cast(pl.Float64).alias(f"#sf:{f}"),
                i.count().cast(pl.Int64).alias(f"#ni:{f}"),
                fl.count().cast(pl.Int64).alias(f"#nf:{f}"),
            ]
        for f in self._fields("min"):
            out += [
                pl.col(int_col(f)).min().alias(f"#mini:{f}"),
                pl.col(float_col(f)).min().alias(f"#minf:{f}"),
            ]
        for f in self._fields("max"):
            out += [
                pl.col(int_col(f)).max().alias(f"#maxi:{f}"),
                pl.col(float_col(f)).max().alias(f"#maxf:{f}"),
            ]
        for tag, func in (("f", "first"), ("l", "last")):
            for f in self._fields(func):
                vcols = self._value_cols(f)
                present = pl.any_horizontal([pl.col(c).is_not_null() for c in vcols])
                names = [TIME, SEQ, *vcols]
                suffix = ["t", "q", "i", "f", "s"]
                for src, sfx in zip(names, suffix, strict=False):
                    picked = pl.col(src).filter(present)
                    picked = picked.first() if func == "first" else picked.last()
                    out.append(picked.alias(f"#{tag}{sfx}:{f}"))
        for f in self._fields("count_distinct"):
            text = sketches.canonical(f, self.plan.fields.get(f) == "any")
            out.append(text.drop_nulls().unique().sort().alias(f"#cd:{f}"))
        for f in self._fields("approx_count_distinct"):
            text = sketches.canonical(f, self.plan.fields.get(f) == "any")
            out.append(sketches.hll_codes(text).drop_nulls().unique().sort().alias(f"#hll:{f}"))
        for f in self._fields("median", "quantile"):
            out.append(sketches.number(f).drop_nulls().alias(f"#qv:{f}"))
        for f in self._fields("stddev", "variance"):
            n, mean, m2 = sketches.welford_partial(sketches.number(f))
            out += [n.alias(f"#vn:{f}"), mean.alias(f"#vm:{f}"), m2.alias(f"#vq:{f}")]
        for c in self._conditions():
            out.append(pl.col(int_col(c)).sum().cast(pl.Int64).alias(f"#ci:{c}"))
        for f in self._decimals("sum", "mean"):
            d = pl.col(dec_col(f))
            out += [d.sum().cast(pl.Int128).alias(f"#sd:{f}"),
                    d.count().cast(pl.Int64).alias(f"#nd:{f}")]
        for f in self._decimals("min"):
            out.append(pl.col(dec_col(f)).min().alias(f"#mind:{f}"))
        for f in self._decimals("max"):
            out.append(pl.col(dec_col(f)).max().alias(f"#maxd:{f}"))
        return out

    # ---------------------------------------------------------------- combine
    def combine(self) -> list[pl.Expr]:
        """Aggregations that merge accumulator rows of the same window."""
        out: list[pl.Expr] = [pl.col(COUNT).sum()]
        for f in self._fields("sum", "mean"):
            out += [pl.col(f"#{p}:{f}").sum() for p in ("si", "sf", "ni", "nf")]
        for f in self._fields("min"):
            out += [pl.col(f"#mini:{f}").min(), pl.col(f"#minf:{f}").min()]
        for f in self._fields("max"):
            out += [pl.col(f"#maxi:{f}").max(), pl.col(f"#maxf:{f}").max()]
        for tag, func in (("f", "first"), ("l", "last")):
            for f in self._fields(func):
                t, q = f"#{tag}t:{f}", f"#{tag}q:{f}"
                desc = func == "last"
                cols = [t, q, f"#{tag}i:{f}", f"#{tag}f:{f}"]
                if self.plan.fields.get(f) == "any":
                    cols.append(f"#{tag}s:{f}")
                for c in cols:
                    out.append(
                        pl.col(c)
                        .sort_by([t, q], descending=desc, nulls_last=True)
                        .first()
                        .alias(c)
                    )
        for f in self._fields("count_distinct"):
            c = f"#cd:{f}"
            out.append(pl.col(c).explode().drop_nulls().unique().sort().alias(c))
        for f in self._fields("approx_count_distinct"):
            c = f"#hll:{f}"
            out.append(pl.col(c).explode().drop_nulls().unique().sort().alias(c))
        for f in self._fields("median", "quantile"):
            c = f"#qv:{f}"
            out.append(pl.col(c).explode().drop_nulls().alias(c))
        for f in self._fields("stddev", "variance"):
            names = (f"#vn:{f}", f"#vm:{f}", f"#vq:{f}")
            for name, expr in zip(names, sketches.welford_combine(*names), strict=True):
                out.append(expr.alias(name))
        for c in self._conditions():
            out.append(pl.col(f"#ci:{c}").sum())
        for f in self._decimals("sum", "mean"):
            out += [pl.col(f"#sd:{f}").sum(), pl.col(f"#nd:{f}").sum()]
        for f in self._decimals("min"):
            out.append(pl.col(f"#mind:{f}").min())
        for f in self._decimals("max"):
            out.append(pl.col(f"#maxd:{f}").max())
        return out

    def combine_pair(self, suffix: str) -> list[pl.Expr]:
        """Expressions merging two rows of the same window side by side, as
        :meth:`combine` merges them: the earlier row's accumulators under their
        names plus ``suffix`` (all null when there is no such row), the later
        row's under their own names."""
        out: list[pl.Expr] = []
        for name in self.schema():
            early, late = pl.col(name + suffix), pl.col(name)
            if name.startswith(("#mini:", "#minf:", "#mind:")):
                out.append(pl.min_horizontal(early, late).alias(name))
            elif name.startswith(("#maxi:", "#maxf:", "#maxd:")):
                out.append(pl.max_horizontal(early, late).alias(name))
            elif name.startswith(LIST_STATES):
                empty = pl.lit([], dtype=self.schema()[name])
                both = pl.concat_list([early.fill_null(empty), late.fill_null(empty)])
                if name.startswith("#qv:"):
                    out.append(both.alias(name))
                else:
                    out.append(both.list.unique().list.sort().alias(name))
            elif name == COUNT or name.startswith(("#si:", "#sf:", "#ni:", "#nf:", "#ci:",
                                                   "#sd:", "#nd:")):
                out.append(
                    pl.when(early.is_null())
                    .then(late)
                    .when(late.is_null())
                    .then(early)
                    .otherwise(early + late)
                    .alias(name)
                )
        for tag, func in (("f", "first"), ("l", "last")):
            for f in self._fields(func):
                t, q = f"#{tag}t:{f}", f"#{tag}q:{f}"
                et, eq, lt, lq = pl.col(t + suffix), pl.col(q + suffix), pl.col(t), pl.col(q)
                if func == "first":
                    early_wins = (et < lt) | ((et == lt) & (eq < lq))
                else:
                    early_wins = (et > lt) | ((et == lt) & (eq > lq))
                take_early = et.is_not_null() & (lt.is_null() | early_wins)
                cols = [t, q, f"#{tag}i:{f}", f"#{tag}f:{f}"]
                if self.plan.fields.get(f) == "any":
                    cols.append(f"#{tag}s:{f}")
                for c in cols:
                    out.append(
                        pl.when(take_early).then(pl.col(c + suffix)).otherwise(pl.col(c)).alias(c)
                    )
        for f in self._fields("stddev", "variance"):
            names = (f"#vn:{f}", f"#vm:{f}", f"#vq:{f}")
            for name, expr in zip(names, sketches.welford_pair(*names, suffix), strict=True):
                out.append(expr.alias(name))
        return out

    def combine_ranges(
        self, frags: pl.DataFrame, order: np.ndarray, r0: np.ndarray, r1: np.ndarray
    ) -> list[pl.Series] | None:
        """Combine the accumulator rows ``frags[order][r0[i]:r1[i]]`` (never empty)
        for every ``i``, like :meth:`combine` on each range; None when this layout
        is not supported (first/last, or a NaN where min/max would meet it).

        Integer sums are exact prefix-sum differences; float sums add the rows of
        a range one by one in row order (starting from 0.0, as Polars' sum does);
        min/max take the smallest/largest non-null value.
        """
        if self.needs_order() or any(name.startswith(("#vn:", "#sd:", "#mind:", "#maxd:",
                                                      *LIST_STATES))
                                     for name in self.schema()):
            return None  # decimals: the general path (their exact sums are Int128)
        n = order.size
        width = int((r1 - r0).max())
        # row j - 1 of slots: the index of each range's j-th row, or the pad row n past it
        slots = r0 + np.arange(1, width, dtype=np.int64)[:, None]
        slots[slots >= r1] = n
        out: list[pl.Series] = []
        for name, dtype in self.schema().items():
            col = frags.get_column(name)
            if name.startswith(("#mini:", "#minf:", "#maxi:", "#maxf:")):
                is_min = name.startswith("#min")
                if dtype == pl.Float64:
                    if col.is_nan().any():
                        return None
                    pad: float | int = np.inf if is_min else -np.inf
                else:
                    pad = int(np.iinfo(np.int64).max if is_min else np.iinfo(np.int64).min)
                values = col.fill_null(pad).to_numpy()[order]
                values = np.append(values, np.array([pad], dtype=values.dtype))
                pick = np.minimum if is_min else np.maximum
                acc = values[r0]
                for row in values[slots]:
                    pick(acc, row, out=acc)
                present = np.concatenate([[0], np.cumsum(col.is_not_null().to_numpy()[order])])
                empty = (present[r1] - present[r0]) == 0
                out.append(
                    pl.Series(name, acc, dtype=dtype).scatter(np.flatnonzero(empty), None)
                    if empty.any()
                    else pl.Series(name, acc, dtype=dtype)
                )
            elif dtype == pl.Float64:  # a float sum: one addition per row, in row order
                values = np.append(col.fill_null(0.0).to_numpy()[order], 0.0)
                acc = np.zeros(r0.size) + values[r0]
                for row in values[slots]:
                    np.add(acc, row, out=acc)
                out.append(pl.Series(name, acc, dtype=dtype))
            else:  # an integer sum (Int64, or Int128 when it fits): exact prefix sums
                ints = col.fill_null(0)
                if dtype != pl.Int64:
                    if ints.abs().sum() >= 2**63:
                        prefix = pl.concat(
                            [pl.Series(name, [0], dtype=dtype), ints.gather(order).cum_sum()]
                        )
                        out.append(prefix.gather(r1) - prefix.gather(r0))
                        continue
                    ints = ints.cast(pl.Int64)
                run = np.zeros(n + 1, dtype=np.int64)
                np.cumsum(ints.to_numpy()[order], out=run[1:])
                out.append(pl.Series(name, run[r1] - run[r0], dtype=dtype))
        return out

    # ---------------------------------------------------------------- finalize
    def finalize(self, fired: pl.DataFrame,
                 present: dict[str, pl.Expr] | None = None) -> pl.DataFrame:
        """Turn fired windows into result rows.

        Columns: ``key``, ``__kint``, ``window_start``, ``window_end``, one typed
        column per aggregate (Int64 when every row's value is an integer, else
        Float64, or String JSON text for non-numeric first/last), and
        ``__json``, the output line with per-row types. Aggregates named ``?...``
        are internal (a join's seen-counts): not written. ``present``: aggregate name
        -> a condition over ``fired``; where it is false the value is null (a join's
        side without events).
        """
        if fired.height > 1 and not in_result_order(fired):
            # sort first, so that the JSON lines are built in output order
            fired = take(fired, result_order(fired))
        typed: list[pl.Expr] = []
        frags: list[pl.Expr] = []
        shown = [a for a in self.aggregates if not a.name.startswith("?")]
        for a in shown:
            value, frag = self._final(a, fired)
            if present is not None and a.name in present:
                value = pl.when(present[a.name]).then(value)
                frag = pl.when(present[a.name]).then(frag)
            typed.append(value.alias(a.name))
            frags.append(frag.alias(f"__frag:{a.name}"))
        plain, any_int, all_int = fired.select(
            ~pl.col(KEY).str.contains(_NOT_PLAIN).any().alias("plain"),
            pl.col(KEY_IS_INT).any().alias("any_int"),
            pl.col(KEY_IS_INT).all().alias("all_int"),
        ).row(0)
        head: list[str | pl.Expr]
        if self.named_key:
            head = ["{", pl.col(KEY), ',"window_start":']
        elif plain and not any_int:  # every key its own JSON text in quotes
            head = ['{"key":"', pl.col(KEY), '","window_start":']
        elif all_int:
            head = ['{"key":', pl.col(KEY), ',"window_start":']
        else:
            quoted = pl.concat_str([pl.lit('"'), pl.col(KEY), pl.lit('"')])
            key_json = (
                pl.when(pl.col(KEY_IS_INT))
                .then(pl.col(KEY))
                .otherwise(quoted if plain else _json_string(pl.col(KEY)))
            )
            head = ['{"key":', key_json, ',"window_start":']
        parts: list[str | pl.Expr] = [
            *head,
            pl.col(WSTART).cast(pl.String),
            ',"window_end":',
            pl.col(WEND).cast(pl.String),
        ]
        for a in shown:
            parts += [f',"{a.name}":', pl.col(f"__frag:{a.name}").fill_null("null")]
        parts.append("}")
        json_line = _format(parts).alias("__json")
        return fired.select(
            pl.col(KEY).alias("key"),
            pl.col(KEY_IS_INT),
            pl.col(WSTART),
            pl.col(WEND),
            *typed,
            fired.with_columns(frags).select(json_line).to_series(),
        )

    def _final(self, a: Aggregate, fired: pl.DataFrame) -> tuple[pl.Expr, pl.Expr]:
        f = a.field
        if a.func == "count":
            return pl.col(COUNT), pl.col(COUNT).cast(pl.String)
        if a.func == "count_if":
            c = pl.col(f"#ci:{condition_field(a.name)}").fill_null(0)
            return c, c.cast(pl.String)
        assert f is not None
        if a.func in ("count_distinct", "approx_count_distinct"):
            if a.func == "count_distinct":
                n = pl.col(f"#cd:{f}").list.len().cast(pl.Int64).fill_null(0)
            else:
                n = sketches.hll_estimate(pl.col(f"#hll:{f}")).fill_null(0)
            return n, n.cast(pl.String)
        if a.func in ("median", "quantile"):
            assert a.q is not None
            values = pl.col(f"#qv:{f}")
            q = values.list.eval(pl.element().quantile(a.q, "linear")).list.first()
            return q, _float_json(q)
        if a.func in ("stddev", "variance"):
            var = sketches.welford_variance(f"#vn:{f}", f"#vq:{f}")
            value = var.sqrt() if a.func == "stddev" else var
            return value, _float_json(value)
        if f in self.plan.decimals:
            return self._decimal_final(a, f)
        if a.func in ("sum", "mean"):
            si, sf = pl.col(f"#si:{f}"), pl.col(f"#sf:{f}")
            ni, nf = pl.col(f"#ni:{f}"), pl.col(f"#nf:{f}")
            if a.func == "mean":
                n = ni + nf
                mean = pl.when(n > 0).then((si.cast(pl.Float64) + sf) / n).otherwise(None)
                return mean, pl.when(n > 0).then(_float_json(mean)).otherwise(None)
            as_float = si.cast(pl.Float64) + sf
            is_float = nf > 0
            is_int = (nf == 0) & (ni > 0)
            return self._mixed(fired, is_int, is_float, si, as_float)
        if a.func in ("min", "max"):
            vi, vf = pl.col(f"#{a.func}i:{f}"), pl.col(f"#{a.func}f:{f}")
            better_int = (vi <= vf) if a.func == "min" else (vi >= vf)
            is_int = vi.is_not_null() & (vf.is_null() | better_int)
            is_float = vf.is_not_null() & ~is_int
            return self._mixed(fired, is_int, is_float, vi, vf)
        tag = "f" if a.func == "first" else "l"
        vi, vf = pl.col(f"#{tag}i:{f}"), pl.col(f"#{tag}f:{f}")
        is_int, is_float = vi.is_not_null(), vf.is_not_null()
        if self.plan.fields.get(f) == "any":
            vs = pl.col(f"#{tag}s:{f}")
            frag = (
                pl.when(is_int)
                .then(vi.cast(pl.String))
                .when(is_float)
                .then(_float_json(vf))
                .otherwise(vs)
            )
            if fired.select(vs.is_not_null().any()).item():
                return frag, frag
        return self._mixed(fired, is_int, is_float, vi, vf)

    def _decimal_final(self, a: Aggregate, f: str) -> tuple[pl.Expr, pl.Expr]:
        """(typed Decimal value, JSON string fragment) of sum/min/max/mean over decimal
        field ``f``: exact, from the Int128 unit counts."""
        precision, scale = self.plan.decimals[f]
        if a.func == "mean":
            out_scale = mean_scale(scale)
            total, n = pl.col(f"#sd:{f}"), pl.col(f"#nd:{f}").cast(pl.Int128)
            num = total * (10 ** (out_scale - scale))
            # half away from zero: floor((2|num| + n) / 2n), with num's sign
            units = (num.abs() * 2 + n) // (n * 2)
            units = pl.when(num < 0).then(pl.lit(0, dtype=pl.Int128) - units).otherwise(units)
            units = pl.when(n > 0).then(units)
            width = 38
        elif a.func == "sum":
            out_scale, width = scale, 38
            units = pl.when(pl.col(f"#nd:{f}") > 0).then(pl.col(f"#sd:{f}"))
        else:
            out_scale, width = scale, precision
            units = pl.col(f"#{a.func}d:{f}")
        text = unscaled_text(units, out_scale)
        value = text.str.to_decimal(scale=out_scale).cast(pl.Decimal(width, out_scale))
        return value, json_str(text)

    @staticmethod
    def _mixed(
        fired: pl.DataFrame, is_int: pl.Expr, is_float: pl.Expr, vi: pl.Expr, vf: pl.Expr
    ) -> tuple[pl.Expr, pl.Expr]:
        frag = (
            pl.when(is_int)
            .then(vi.cast(pl.String))
            .when(is_float)
            .then(_float_json(vf.cast(pl.Float64)))
            .otherwise(None)
        )
        any_float = fired.select(is_float.any()).item() if fired.height else False
        if any_float:
            value = (
                pl.when(is_int)
                .then(vi.cast(pl.Float64))
                .when(is_float)
                .then(vf.cast(pl.Float64))
                .otherwise(None)
            )
        else:
            ints = pl.when(is_int).then(vi).otherwise(None)
            in_range = fired.select(
                ints.is_between(-(2**63), 2**63 - 1).or_(ints.is_null()).all()
            ).item() if fired.height else True
            # an exact integer beyond int64 stays exact in the JSON line; the typed
            # column (for columnar sinks) falls back to Float64
            value = ints.cast(pl.Int64) if in_range else ints.cast(pl.Float64)
        return value, frag

