"""Property test: an enriched pipeline (through ``sealstream run``) against the
reference model (tests/reference.py) with the as-of lookup written in plain Python.

Random partitions (1-3, disordered times, lateness), window kinds, batch sizes and
checkpoint intervals from tests/test_properties.py; a random versioned table (0-3
versions per key, some keys absent) as Parquet; ``on_missing`` null or drop; an
optional filter. The reference joins each event with the row of its key whose
``since`` is the greatest not after the event's time, before the filter and the
windows, as docs/enrich.md says.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import polars as pl
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import reference as ref
from helpers import Output, assert_same_output, read_jsonl_dir, spec_text
from sealstream.cli import main
from test_properties import MEANING, cases

Row = tuple[str, int, str, float]  # key text, valid from, country, rate


def as_of(rows: list[Row], key: Any, t: int) -> Row | None:
    """The reference lookup: the key's row with the greatest valid_from <= t."""
    text = str(key)  # keys compare as text: 1 and "1" are the same key
    best: Row | None = None
    for row in rows:
        if row[0] == text and row[1] <= t and (best is None or row[1] > best[1]):
            best = row
    return best


@st.composite
def tables(draw: st.DrawFn) -> list[Row]:
    rows: list[Row] = []
    for key in ["a", "b", "c", "1", "2"]:
        for since in sorted(set(draw(st.lists(st.integers(0, 80), max_size=3)))):
            rows.append((key, since, draw(st.sampled_from(["FR", "DE", "JP"])),
                         draw(st.integers(-8, 8)) / 4))
    return rows


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(case=cases(), rows=tables(), on_missing=st.sampled_from(["null", "drop"]),
       where=st.sampled_from([None, "v > 1"]))
def test_enriched_runs_match_the_reference(case: Any, rows: list[Row], on_missing: str,
                                           where: str | None) -> None:
    case.aggregates = {"n": "count", "r": "sum(rate)", "c": "last(country)",
                       "d": "count_distinct(country)"}
    case.where = where

    def lookup(i: int) -> Any:
        def fn(r: dict[str, Any]) -> Any:
            row = as_of(rows, r["k"], ref.parse_time(r["ts"]))
            return None if row is None else row[i]
        return fn

    def keep(r: dict[str, Any]) -> bool | None:
        found = as_of(rows, r["k"], ref.parse_time(r["ts"])) is not None
        ok = True if where is None else MEANING[where](r)
        return (found or on_missing == "null") and ok is True

    expected = ref.run(case.partitions, key=case.key, time=case.time,
                       max_delay_ms=case.max_delay_ms, window=case.window,
                       aggregates=case.aggregates,
                       fields={"country": lookup(2), "rate": lookup(3)}, where=keep,
                       conditions=MEANING)
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        for name, text in case.partitions:
            (d / name).parent.mkdir(parents=True, exist_ok=True)
            (d / name).write_text(text)
        pl.DataFrame(rows, schema={"k": pl.String, "since": pl.Int64, "country": pl.String,
                                   "rate": pl.Float64}, orient="row").write_parquet(
            d / "users.parquet")
        spec = d / "spec.toml"
        spec.write_text(spec_text(case) + '\n[[enrich]]\nname = "users"\nkind = "parquet"\n'
                        'path = "users.parquet"\non = "k"\nvalid_from = "since"\n'
                        f'on_missing = "{on_missing}"\n')
        assert main(["run", str(spec), "-q"]) == 0, spec.read_text()
        got = Output(read_jsonl_dir(d / "out"), read_jsonl_dir(d / "late"))
    assert_same_output(Output(expected.results, expected.late), got, case)
