"""Columnar building blocks of the newer aggregates: canonical values, HyperLogLog
registers, and the parallel variance formula. Every piece is a Polars expression.

Canonical values (``count_distinct``, ``approx_count_distinct``): a value's text
that two values share exactly when the aggregates count them as one value.
Numbers compare by value (``1`` and ``1.0`` are one value), text by its
characters, and a number never equals a string (``1`` and ``"1"`` are two).

HyperLogLog (``approx_count_distinct``): precision ``p`` = :data:`HLL_PRECISION`
(``m = 2**p`` registers). A value's 64-bit hash (Polars' ``hash`` with a fixed
seed) picks a register by its top ``p`` bits; the register keeps the largest
rank (leading zeros of the other bits, plus one). A window keeps its registers
sparse, as a list of codes ``register * 64 + rank`` (only registers that are
set; several codes of one register may stand until the next merge, the largest
counts). Merging is the union of the lists: associative, commutative, and
idempotent, so panes and sessions merge like any other state. The estimate is
Flajolet et al.'s with the linear-counting correction for small counts; its
relative standard error is ``1.04 / sqrt(m)``, 1.6 % for ``p = 12``.

Variance (``stddev``, ``variance``): each row keeps ``n``, the mean and ``M2`` (the
sum of squared deviations from the mean). A batch computes them in two passes
(mean, then deviations); rows merge with the parallel formula of Chan et al.
(``M2 = sum M2_i + sum n_i (mean_i - mean)**2``), never with sums of squares, so
a large mean does not cancel the variance away.
"""

from __future__ import annotations

import math

import polars as pl

from sealstream.sources._base import float_col, int_col, json_col

HLL_PRECISION = 12
_M = 1 << HLL_PRECISION
_SEED = 0x5EA15
_ALPHA = 0.7213 / (1 + 1.079 / _M)
HLL_RELATIVE_ERROR = 1.04 / math.sqrt(_M)
"""The sketch's relative standard error (about 0.016)."""


def canonical(f: str, has_text: bool) -> pl.Expr:
    """The canonical text of field ``f``'s value (null when the value is null).

    Integers and integral floats within int64 as decimal digits, other floats as
    Polars prints them (``0.5``, ``inf``), anything else as its JSON text (a
    string keeps its quotes, so it never meets a number)."""
    i, x = pl.col(int_col(f)), pl.col(float_col(f))
    integral = x.is_finite() & (x == x.floor()) & (x.abs() < 2.0**63)
    out = (
        pl.when(i.is_not_null())
        .then(i.cast(pl.String))
        .when(integral)
        .then(x.cast(pl.Int64, strict=False).cast(pl.String))
        .when(x.is_not_null())
        .then(x.cast(pl.String))
    )
    if has_text:
        return out.otherwise(pl.col(json_col(f)))
    return out.otherwise(None)


def number(f: str) -> pl.Expr:
    """Field ``f``'s value as a Float64 (null when it is null)."""
    return pl.coalesce(pl.col(int_col(f)).cast(pl.Float64), pl.col(float_col(f)))


def hll_codes(value: pl.Expr) -> pl.Expr:
    """``register * 64 + rank`` (UInt32) of each non-null canonical ``value``."""
    h = value.hash(seed=_SEED)
    register = (h // (1 << (64 - HLL_PRECISION))).cast(pl.UInt32)
    # the leading zeros of the bits below the register's (all 64 - p of them when zero)
    rest = h % (1 << (64 - HLL_PRECISION))
    rank = rest.bitwise_leading_zeros().cast(pl.UInt32) - HLL_PRECISION + 1
    return pl.when(value.is_not_null()).then(register * 64 + rank)


def hll_compact(codes: pl.Expr) -> pl.Expr:
    """A list of codes reduced to one code per register (its largest rank), sorted."""
    e = pl.element()
    return codes.list.eval(
        e.sort().filter(((e // 64) != (e // 64).shift(-1)).fill_null(True))
    )


def hll_estimate(codes: pl.Expr) -> pl.Expr:
    """The HyperLogLog estimate (Int64) from a window's list of codes."""
    e = pl.element()
    compact = hll_compact(codes)
    present = compact.list.len().cast(pl.Float64)
    inverse = compact.list.eval((2.0 ** -(e % 64).cast(pl.Float64)).sum()).list.first()
    z = inverse.fill_null(0.0) + (_M - present)
    raw = _ALPHA * _M * _M / z
    zeros = _M - present
    linear = _M * (pl.lit(float(_M)) / zeros).log()
    est = pl.when((raw <= 2.5 * _M) & (zeros > 0)).then(linear).otherwise(raw)
    return est.round(0).cast(pl.Int64)


# ---------------------------------------------------------------- variance
def welford_partial(x: pl.Expr) -> tuple[pl.Expr, pl.Expr, pl.Expr]:
    """``(n, mean, M2)`` of the non-null values of ``x`` in a group (two passes)."""
    n = x.count().cast(pl.Int64)
    mean = x.mean()
    m2 = ((x - mean) ** 2).sum()
    return n, mean, pl.when(n > 0).then(m2).otherwise(0.0)


def welford_combine(n: str, mean: str, m2: str) -> tuple[pl.Expr, pl.Expr, pl.Expr]:
    """Merge the rows of a group: ``(n, mean, M2)`` by the parallel formula."""
    cn, cm, cq = pl.col(n), pl.col(mean), pl.col(m2)
    total = cn.sum()
    weighted = pl.when(cn > 0).then(cn.cast(pl.Float64) * cm).otherwise(0.0)
    new_mean = pl.when(total > 0).then(weighted.sum() / total)
    spread = pl.when(cn > 0).then(cn.cast(pl.Float64) * (cm - new_mean) ** 2).otherwise(0.0)
    return total, new_mean, cq.fill_null(0.0).sum() + spread.sum()


def welford_pair(
    n: str, mean: str, m2: str, suffix: str
) -> tuple[pl.Expr, pl.Expr, pl.Expr]:
    """Merge two rows side by side (Chan et al.); a missing row has null ``n``."""
    na, ma, qa = (pl.col(n + suffix).fill_null(0), pl.col(mean + suffix),
                  pl.col(m2 + suffix).fill_null(0.0))
    nb, mb, qb = pl.col(n).fill_null(0), pl.col(mean), pl.col(m2).fill_null(0.0)
    total = na + nb
    fa, fb, ft = na.cast(pl.Float64), nb.cast(pl.Float64), total.cast(pl.Float64)
    delta = mb - ma
    new_mean = (
        pl.when(na == 0).then(mb).when(nb == 0).then(ma).otherwise(ma + delta * fb / ft)
    )
    new_m2 = (
        pl.when(na == 0).then(qb).when(nb == 0).then(qa)
        .otherwise(qa + qb + delta * delta * fa * fb / ft)
    )
    return total, new_mean, new_m2


def welford_variance(n: str, m2: str) -> pl.Expr:
    """The sample variance ``M2 / (n - 1)``; null below two values (as SQL's
    ``var_samp``)."""
    return pl.when(pl.col(n) > 1).then(pl.col(m2) / (pl.col(n) - 1).cast(pl.Float64))
