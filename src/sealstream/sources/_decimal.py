"""Exact parsing of fields declared ``decimal(P, S)`` (columnar, never a float).

A value is a decimal number when its text is ``-?digits[.digits]``: a JSON number
as written (its token, not the parsed float), a JSON string, CSV text, a Parquet
integer or decimal column. It fits ``decimal(P, S)`` when it has at most ``P - S``
integer digits (leading zeros aside) and at most ``S`` fraction digits (trailing
zeros aside): nothing is ever rounded, a value that does not fit is a bad record.
The exact value is kept as an Int128 count of ``10**-S`` units.
"""

from __future__ import annotations

import polars as pl

__all__ = ["decimal_columns", "unscaled_text"]

_NUMBER = r"^-?[0-9]+(\.[0-9]+)?$"


def decimal_columns(text: pl.Series, precision: int, scale: int) -> pl.DataFrame:
    """For the value texts ``text`` (null: no value): ``value``, the Int128 count of
    ``10**-scale`` units (null when the text is null, not a decimal number or does
    not fit), ``not_number`` and ``too_big`` (which of the two it is). Columnar, in a
    few plain string steps (no regex groups: they cost several times more)."""
    t = pl.col("t")
    g = pl.DataFrame({"t": text.cast(pl.String)}).select(
        (t.is_not_null() & ~t.str.contains(_NUMBER)).fill_null(False).alias("not_number"),
        t.str.starts_with("-").fill_null(False).alias("neg"),
        t.is_not_null().alias("present"),
        t.str.strip_prefix("-").str.split_exact(".", 1).alias("parts"),
    ).unnest("parts")
    g = g.select(
        "not_number", "neg", "present",
        pl.col("field_0").str.strip_chars_start("0").alias("whole"),
        pl.col("field_1").fill_null("").str.strip_chars_end("0").alias("frac"),
    )
    fits = ((pl.col("whole").str.len_bytes() <= precision - scale)
            & (pl.col("frac").str.len_bytes() <= scale))
    ok = pl.col("present") & ~pl.col("not_number") & fits
    # "0" before the digits: "0.00" (no digit left) is 0, "-0123" is -123
    digits = pl.concat_str([pl.when(pl.col("neg")).then(pl.lit("-")).otherwise(pl.lit("")),
                            pl.lit("0"), pl.col("whole"), pl.col("frac").str.pad_end(scale, "0")])
    return g.select(
        pl.when(ok).then(digits.cast(pl.Int128, strict=False)).cast(pl.Int128).alias("value"),
        pl.col("not_number"),
        (pl.col("present") & ~pl.col("not_number") & ~fits).fill_null(False).alias("too_big"),
    )


def unscaled_text(value: pl.Expr, scale: int) -> pl.Expr:
    """The exact decimal text of Int128 counts of ``10**-scale`` units: ``1250``
    with scale 2 is ``12.50`` (always ``scale`` fraction digits; null stays null)."""
    digits = value.abs().cast(pl.String).str.zfill(scale + 1)
    sign = pl.when(value < 0).then(pl.lit("-")).otherwise(pl.lit(""))
    if scale == 0:
        return pl.concat_str([sign, digits])
    return pl.concat_str([sign, digits.str.head(-scale), pl.lit("."), digits.str.tail(scale)])
