"""``sealstream compare A B``: two result outputs, window by window.

Exit codes: 0 equal within the tolerance, 1 they differ (or a database could not
be read), 2 bad input (one line: a missing path, not results, different key
shapes). See :mod:`sealstream.compare` for what equal means.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import click

from sealstream.errors import SealstreamError

if TYPE_CHECKING:
    import polars as pl

    from sealstream.compare import Comparison, Results

__all__ = ["compare_cmd"]


@click.command("compare")
@click.argument("a", type=str)
@click.argument("b", type=str)
@click.option("--rel-tol", type=click.FloatRange(min=0.0), default=1e-9, show_default=True,
              help="Relative tolerance for numbers that are not both integers.")
@click.option("--abs-tol", type=click.FloatRange(min=0.0), default=0.0, show_default=True,
              help="Absolute tolerance for numbers that are not both integers.")
@click.option("--table", help="The table of A and B when they are databases.")
@click.option("--table-a", help="The table of A (a SQLite file or PostgreSQL URL).")
@click.option("--table-b", help="The table of B (a SQLite file or PostgreSQL URL).")
@click.option("--limit", type=click.IntRange(min=0), default=20, show_default=True,
              help="Rows shown per section (--json lists every one).")
@click.option("--json", "as_json", is_flag=True, help="A machine-readable report.")
def compare_cmd(a: str, b: str, rel_tol: float, abs_tol: float, table: str | None,
                table_a: str | None, table_b: str | None, limit: int, as_json: bool) -> None:
    """Compare the results A and B (each a JSON Lines or Parquet results directory or
    file, a SQLite file or a PostgreSQL URL with --table): windows only in A, only in
    B, and differing values. Floats compare within the tolerance, everything else
    exactly. Exit 0 equal, 1 different, 2 bad input."""
    from sealstream.cli import _Exit  # the code main() returns
    from sealstream.compare import compare, read_results

    try:
        left = read_results(a, table_a or table)
        right = read_results(b, table_b or table)
        found = compare(left, right, rel_tol=rel_tol, abs_tol=abs_tol)
    except SealstreamError as err:
        click.echo(f"sealstream: error: {err}", err=True)
        raise _Exit(err.exit_code) from None
    click.echo(render_json(found, rel_tol, abs_tol) if as_json
               else render(found, rel_tol, abs_tol, limit))
    if not found.equal:
        raise _Exit(1)


def _key_json(r: Results) -> pl.Expr:
    import polars as pl

    key = pl.col("__key")
    return key if r.key_fields is None else pl.concat_str([pl.lit("{"), key, pl.lit("}")])


def _windows_json(frame: pl.DataFrame, r: Results, extra: list[pl.Expr] | None = None) -> str:
    """The rows of ``frame`` as a JSON array of objects, built column by column."""
    import polars as pl

    if not frame.height:
        return "[]"
    parts: list[pl.Expr] = [pl.lit('{"key":'), _key_json(r),
                            pl.lit(',"window_start":'), pl.col("window_start").cast(pl.String),
                            pl.lit(',"window_end":'), pl.col("window_end").cast(pl.String),
                            *(extra or []), pl.lit("}")]
    text = frame.select(pl.concat_str(parts).str.join(",")).item()
    return f"[{text}]"


def render_json(found: Comparison, rel_tol: float, abs_tol: float) -> str:
    """The report as one JSON object (see docs/compare.md)."""
    import polars as pl

    from sealstream.sources._parse import json_str

    value_parts = [pl.lit(',"field":'), json_str(pl.col("field")),
                   pl.lit(',"a":'), pl.col("a").fill_null("null"),
                   pl.lit(',"b":'), pl.col("b").fill_null("null")]
    head = {"equal": found.equal, "rel_tol": rel_tol, "abs_tol": abs_tol,
            "a": {"where": found.a.where, "windows": found.a.frame.height},
            "b": {"where": found.b.where, "windows": found.b.frame.height}}
    body = json.dumps(head)[:-1]
    return (
        f'{body},"only_in_a":{{"count":{found.only_a.height},"windows":'
        f"{_windows_json(found.only_a, found.a)}}},"
        f'"only_in_b":{{"count":{found.only_b.height},"windows":'
        f"{_windows_json(found.only_b, found.b)}}},"
        f'"differing":{{"windows":{found.differing_windows},'
        f'"values":{found.differing.height},'
        f'"rows":{_windows_json(found.differing, found.a, value_parts)}}}}}'
    )


def _lines(frame: pl.DataFrame, limit: int, extra: list[pl.Expr] | None = None) -> list[str]:
    import polars as pl

    shown = frame.head(limit).select(pl.concat_str([
        pl.lit("  key "), pl.col("__key"), pl.lit(" window ["),
        pl.col("window_start").cast(pl.String), pl.lit(", "),
        pl.col("window_end").cast(pl.String), pl.lit(")"), *(extra or [])]))
    out: list[str] = shown.to_series().to_list()
    if frame.height > limit:
        out.append(f"  ... and {frame.height - limit} more (--limit, --json)")
    return out


def render(found: Comparison, rel_tol: float, abs_tol: float, limit: int) -> str:
    """The report for a terminal: counts, then up to ``limit`` rows per section."""
    import polars as pl

    lines = [f"A: {found.a.where}: {found.a.frame.height} windows",
             f"B: {found.b.where}: {found.b.frame.height} windows",
             f"only in A: {found.only_a.height} windows", *_lines(found.only_a, limit),
             f"only in B: {found.only_b.height} windows", *_lines(found.only_b, limit),
             f"differing: {found.differing_windows} windows, {found.differing.height} values",
             *_lines(found.differing, limit, [
                 pl.lit(" "), pl.col("field"), pl.lit(": A "), pl.col("a").fill_null("null"),
                 pl.lit(", B "), pl.col("b").fill_null("null")])]
    tol = f"rel-tol {rel_tol:g}, abs-tol {abs_tol:g}"
    lines.append(f"equal (within {tol})" if found.equal else f"different (with {tol})")
    return "\n".join(lines)

