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

__all__ = ["decimal_parts", "unscaled_text"]

_NUMBER = r"^-?[0-9]+(\.[0-9]+)?$"


def decimal_parts(text: pl.Expr, precision: int,
                  scale: int) -> tuple[pl.Expr, pl.Expr, pl.Expr]:
    """(value, not_a_number, too_big) of the value texts ``text`` (null: no value).

    ``value`` is the Int128 count of ``10**-scale`` units, null when the text is
    null, not a decimal number or does not fit; the two masks tell which."""
    text = text.str.strip_chars()
    number = text.str.contains(_NUMBER)
    body = text.str.strip_prefix("-")
    whole = body.str.extract(r"^([0-9]+)", 1).str.strip_chars_start("0")
    frac = body.str.extract(r"\.([0-9]+)$", 1).fill_null("").str.strip_chars_end("0")
    fits = (whole.str.len_chars() <= precision - scale) & (frac.str.len_chars() <= scale)
    digits = pl.concat_str([whole, frac.str.pad_end(scale, "0")])
    sign = pl.when(text.str.starts_with("-")).then(pl.lit("-")).otherwise(pl.lit(""))
    signed = pl.concat_str([sign, pl.when(digits == "").then(pl.lit("0")).otherwise(digits)]
                           ).cast(pl.Int128, strict=False)
    ok = number & fits
    return (pl.when(ok).then(signed).otherwise(None).cast(pl.Int128),
            (text.is_not_null() & ~number).fill_null(False),
            (number & ~fits).fill_null(False))


def unscaled_text(value: pl.Expr, scale: int) -> pl.Expr:
    """The exact decimal text of Int128 counts of ``10**-scale`` units: ``1250``
    with scale 2 is ``12.50`` (always ``scale`` fraction digits; null stays null)."""
    digits = value.abs().cast(pl.String).str.zfill(scale + 1)
    sign = pl.when(value < 0).then(pl.lit("-")).otherwise(pl.lit(""))
    if scale == 0:
        return pl.concat_str([sign, digits])
    return pl.concat_str([sign, digits.str.head(-scale), pl.lit("."), digits.str.tail(scale)])
