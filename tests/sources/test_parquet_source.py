"""Parquet partitions: typing by column type, row offsets, batches, positions."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from _files import PLAN
from _helpers import read_chunks, with_raw

from sealstream.errors import SourceChangedError, SourceError
from sealstream.sources import (
    BAD_SCHEMA,
    FieldPlan,
    PartitionPosition,
    float_col,
    int_col,
    json_col,
    open_partition,
)
from sealstream.sources.files.parquet import ParquetReader


def read_all(
    path: Path,
    plan: FieldPlan = PLAN,
    chunk: int = 1000,
    position: PartitionPosition | None = None,
    batch_rows: int = 65_536,
) -> tuple[pl.DataFrame, pl.DataFrame, list[Any]]:
    reader = ParquetReader(str(path), path, plan, position, batch_rows=batch_rows)
    return read_chunks(reader, chunk)


def write(tmp_path: Path, table: pa.Table, row_group_size: int = 4) -> Path:
    p = tmp_path / "p.parquet"
    pq.write_table(table, p, row_group_size=row_group_size)
    return p


def sample(n: int = 11) -> pa.Table:
    return pa.table(
        {
            "user": pa.array([None if i == 3 else i % 4 for i in range(n)], pa.int64()),
            "ts": pa.array([1000 + i for i in range(n)], pa.int64()),
            "amount": pa.array([i / 2 for i in range(n)], pa.float64()),
            "x": pa.array([f"s{i}" for i in range(n)]),
        }
    )


def test_types_come_from_columns(tmp_path: Path) -> None:
    table = pa.table(
        {
            "user": ["a", "b", "c", "d"],
            "ts": pa.array(
                [
                    dt.datetime(2024, 1, 1, 0, 0, 0, 123456),
                    dt.datetime(1969, 12, 31, 23, 59, 59),
                    None,
                    dt.datetime(2024, 1, 1),
                ],
                pa.timestamp("us"),
            ),
            "amount": pa.array([1, 2, 3, None], pa.int32()),
            "x": pa.array([1.0, None, 2.5, None], pa.float64()),
        }
    )
    events, bad, chunks = read_all(write(tmp_path, table), chunk=2)
    assert events["__off"].to_list() == [0, 1, 3]
    assert events["__t"].to_list() == [1704067200123, -1000, 1704067200000]
    assert events["__kint"].to_list() == [False] * 3
    assert events[int_col("amount")].to_list() == [1, 2, None]
    assert events[float_col("x")].to_list() == [1.0, None, None]
    assert json.loads(events["__raw"][0])["user"] == "a"
    assert bad.schema == BAD_SCHEMA
    assert bad.rows() == [(2, 3, "missing time field 'ts'", bad["_raw"][0])]
    assert json.loads(bad["_raw"][0]) == {"user": "c", "ts": None, "amount": 3, "x": 2.5}
    assert chunks[-1].eof and not any(c.eof for c in chunks[:-1])


def test_integer_keys_strings_and_bad_values(tmp_path: Path) -> None:
    table = pa.table(
        {
            "user": pa.array([7, 8, 9], pa.int16()),
            "ts": ["2024-01-01T00:00:00Z", "2024-01-01", "nope"],
            "amount": ["1", "abc", None],
            "x": pa.array([True, False, None]),
        }
    )
    events, bad, _ = read_all(write(tmp_path, table))
    assert bad["_reason"].to_list() == [
        "non-numeric value in field 'amount': \"1\"",
        "non-numeric value in field 'amount': \"abc\"",
        "time field 'ts' is not an integer or ISO-8601 string: \"nope\"",
    ]
    assert events.height == 0
    ok = pa.table({"user": pa.array([7], pa.int16()), "ts": ["2024-01-01"], "x": [True]})
    events, bad, _ = read_all(write(tmp_path, ok))
    assert events["__key"].to_list() == ["7"]
    assert events["__kint"].to_list() == [True]
    assert events[json_col("x")].to_list() == ["true"]
    assert events[int_col("amount")].to_list() == [None]


@pytest.mark.parametrize(("chunk", "batch"), [(1, 3), (2, 5), (3, 2), (100, 4), (5, 100)])
def test_chunks_and_batches_do_not_change_results(tmp_path: Path, chunk: int, batch: int) -> None:
    path = write(tmp_path, sample(23), row_group_size=4)
    whole_ev, whole_bad, _ = read_all(path)
    ev, bad, chunks = read_all(path, chunk=chunk, batch_rows=batch)
    assert ev.equals(whole_ev) and bad.equals(whole_bad)
    assert sum(c.eof for c in chunks) == 1 and chunks[-1].eof
    assert chunks[-1].position.byte_offset == 23


@pytest.mark.parametrize("stop_after", [1, 2, 4, 6])
def test_parquet_resume_equals_continuing(tmp_path: Path, stop_after: int) -> None:
    path = write(tmp_path, sample(23), row_group_size=4)
    whole_ev, whole_bad, _ = read_all(path)
    _, _, first = read_all(path, chunk=3)
    head = first[:stop_after]
    pos = PartitionPosition.from_json(json.loads(json.dumps(head[-1].position.to_json())))
    rest_ev, rest_bad, _ = read_all(path, chunk=5, position=pos, batch_rows=3)
    assert pl.concat([with_raw(c) for c in head] + [rest_ev]).equals(whole_ev)
    assert pl.concat([c.bad for c in head] + [rest_bad]).equals(whole_bad)


def test_rewritten_parquet_file_is_detected(tmp_path: Path) -> None:
    path = write(tmp_path, sample(10))
    _, _, chunks = read_all(path, chunk=3)
    write(tmp_path, sample(12))
    with pytest.raises(SourceChangedError, match=r"p\.parquet.*rewritten"):
        open_partition("parquet", str(path), path, PLAN, chunks[0].position)


def test_empty_parquet_file(tmp_path: Path) -> None:
    path = write(tmp_path, sample(0))
    events, bad, chunks = read_all(path)
    assert len(chunks) == 1 and chunks[0].eof and chunks[0].last_offset is None
    assert events.drop("__raw").schema == PLAN.event_schema()


def test_unreadable_or_incomplete_parquet(tmp_path: Path) -> None:
    junk = tmp_path / "junk.parquet"
    junk.write_text("not parquet")
    with pytest.raises(SourceError, match="junk.parquet"):
        open_partition("parquet", "junk.parquet", junk, PLAN)
    with pytest.raises(SourceError, match="missing.parquet"):
        open_partition("parquet", "missing.parquet", tmp_path / "missing.parquet", PLAN)

def test_a_missing_key_or_time_column_makes_bad_records(tmp_path: Path) -> None:
    # as a JSON line or a CSV row without the field: each row is a bad record
    events, bad, _ = read_all(write(tmp_path, pa.table({"user": ["a", "b"]})))
    assert events.height == 0
    assert bad["_line"].to_list() == [1, 2]
    assert set(bad["_reason"]) == {"missing time field 'ts'"}
    assert bad["_raw"].to_list() == ['{"user":"a"}', '{"user":"b"}']


def test_closing_midway_stops_the_reads_ahead(tmp_path: Path) -> None:
    """Batches are read and typed ahead on the parse threads; closing after the
    first chunk waits for the ones running and cancels the rest (no hang, no
    read from a closed file)."""
    path = write(tmp_path, sample(400), row_group_size=7)
    for _ in range(5):
        reader = ParquetReader(str(path), path, PLAN, None, batch_rows=3)
        first = reader.next_chunk(2)
        assert first is not None and first.events.height + first.bad.height == 2
        reader.close()


@pytest.mark.parametrize("tz", ["+05:30", "-08:00", "America/New_York", "UTC"])
def test_time_zone_aware_timestamps_are_instants(tmp_path: Path, tz: str) -> None:
    """Arrow stores a zoned timestamp as its UTC instant: that is the event time,
    whatever the zone (fixed offsets included, which Polars cannot name)."""
    import datetime as dt

    ms = 1_714_564_800_000  # 2024-05-01T12:00:00Z
    ts = pa.array([ms, ms + 1], type=pa.timestamp("ms", tz=tz))
    table = pa.table({"user": ["a", "b"], "ts": ts, "amount": [1, 2]})
    events, bad, _ = read_all(write(tmp_path, table))
    assert bad.height == 0
    assert events["__t"].to_list() == [ms, ms + 1]
    assert dt.datetime.fromtimestamp(ms / 1000, dt.UTC).hour == 12
