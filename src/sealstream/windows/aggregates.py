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
* nulls (and missing fields) are ignored; an aggregate over only nulls is null.

Accumulator columns start with ``#``; window identity columns are
``__key``, ``__kint``, ``window_start``, ``window_end``.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from sealstream.pipeline import Aggregate
from sealstream.sources._base import (
    KEY,
    KEY_IS_INT,
    TIME,
    FieldPlan,
    float_col,
    int_col,
    json_col,
)

SEQ = "__seq"
WSTART = "window_start"
WEND = "window_end"
GROUP = [KEY, KEY_IS_INT, WSTART, WEND]
COUNT = "#n"


def _float_json(expr: pl.Expr) -> pl.Expr:
    """JSON text of a float column: finite values as polars prints them, else null."""
    return pl.when(expr.is_finite()).then(expr.cast(pl.String)).otherwise(pl.lit("null"))


def _json_string(expr: pl.Expr) -> pl.Expr:
    """JSON-escape a string column (with quotes)."""
    return (
        pl.struct(expr.alias("k"))
        .struct.json_encode()
        .str.strip_prefix('{"k":')
        .str.strip_suffix("}")
    )


@dataclass(frozen=True)
class Accumulators:
    """The accumulator layout for a list of aggregates."""

    aggregates: tuple[Aggregate, ...]
    plan: FieldPlan

    # ---------------------------------------------------------------- layout
    def _uses(self, func: str, fld: str) -> bool:
        return any(a.func == func and a.field == fld for a in self.aggregates)

    def _fields(self, *funcs: str) -> list[str]:
        return sorted({a.field for a in self.aggregates if a.func in funcs and a.field})

    def needs_order(self) -> bool:
        """True when first/last need events sorted by (time, sequence)."""
        return any(a.func in ("first", "last") for a in self.aggregates)

    def input_columns(self) -> list[str]:
        """The event columns the partial aggregations read."""
        cols: list[str] = []
        for f in sorted({a.field for a in self.aggregates if a.field}):
            cols += self._value_cols(f)
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
        return s

    def _value_cols(self, f: str) -> list[str]:
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
        return out

    # ---------------------------------------------------------------- finalize
    def finalize(self, fired: pl.DataFrame) -> pl.DataFrame:
        """Turn fired windows into result rows.

        Columns: ``key``, ``__kint``, ``window_start``, ``window_end``, one typed
        column per aggregate (Int64 when every row's value is an integer, else
        Float64, or String JSON text for non-numeric first/last), and
        ``__json``, the output line with per-row types.
        """
        typed: list[pl.Expr] = []
        frags: list[pl.Expr] = []
        for a in self.aggregates:
            value, frag = self._final(a, fired)
            typed.append(value.alias(a.name))
            frags.append(frag.alias(f"__frag:{a.name}"))
        key_json = (
            pl.when(pl.col(KEY_IS_INT)).then(pl.col(KEY)).otherwise(_json_string(pl.col(KEY)))
        )
        parts: list[pl.Expr | str] = [
            pl.lit('{"key":'),
            key_json,
            pl.lit(',"window_start":'),
            pl.col(WSTART).cast(pl.String),
            pl.lit(',"window_end":'),
            pl.col(WEND).cast(pl.String),
        ]
        for a in self.aggregates:
            parts += [pl.lit(f',"{a.name}":'), pl.col(f"__frag:{a.name}").fill_null("null")]
        parts.append(pl.lit("}"))
        json_line = pl.concat_str(parts).alias("__json")
        out = fired.select(
            pl.col(KEY).alias("key"),
            pl.col(KEY_IS_INT),
            pl.col(WSTART),
            pl.col(WEND),
            *typed,
            fired.with_columns(frags).select(json_line).to_series(),
        )
        return out.sort(["window_end", "window_start", "key"])

    def _final(self, a: Aggregate, fired: pl.DataFrame) -> tuple[pl.Expr, pl.Expr]:
        f = a.field
        if a.func == "count":
            return pl.col(COUNT), pl.col(COUNT).cast(pl.String)
        assert f is not None
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

