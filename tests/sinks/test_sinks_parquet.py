"""ParquetDirSink specifics: typed columns, key typing, types across epochs."""

from __future__ import annotations

import os
from pathlib import Path

import polars as pl
import pytest

from sealstream.errors import SinkError
from sealstream.sinks import CommittedFile, ParquetDirSink
from sealstream.sinks.parquet import KEY_IS_INT_METADATA
from sealstream.testing.sink_contract import results_frame, sample_rows


def _commit(sink: ParquetDirSink, epoch: int, rows: list[dict[str, object]]) -> Path:
    sink.write(epoch, results_frame(rows))
    (token,) = sink.prepare(epoch)
    sink.commit(epoch, [token])
    return sink.path / token


def test_typed_columns_without_internal_ones(tmp_path: Path) -> None:
    sink = ParquetDirSink(tmp_path, run_token="r")
    path = _commit(
        sink, 1, [{"key": "u1", "window_start": 0, "window_end": 60, "n": 3, "total": 12.5}]
    )
    assert path.name == "part-000000000001-r.parquet"
    df = pl.read_parquet(path)
    assert df.schema == pl.Schema(
        {
            "key": pl.String,
            "window_start": pl.Int64,
            "window_end": pl.Int64,
            "n": pl.Int64,
            "total": pl.Float64,
        }
    )
    assert df.row(0) == ("u1", 0, 60, 3, 12.5)
    assert KEY_IS_INT_METADATA not in pl.read_parquet_metadata(path)


def test_integer_keys_become_int64(tmp_path: Path) -> None:
    sink = ParquetDirSink(tmp_path, run_token="r")
    path = _commit(sink, 1, [{"key": k, "window_start": 0, "window_end": 1} for k in (1, -2)])
    df = pl.read_parquet(path)
    assert df.schema["key"] == pl.Int64 and df["key"].to_list() == [1, -2]
    ids = sink.read_ids(sink.committed())
    assert ids["key"].to_list() == ["1", "-2"] and ids["__kint"].all()


@pytest.mark.parametrize(
    "keys",
    [[1, "1", "x", 2], [12345678901234567890123, 5], [2**63, -(2**63) - 1]],
)
def test_mixed_or_huge_keys_stay_text_and_keep_int_ness(tmp_path: Path, keys: list[object]) -> None:
    sink = ParquetDirSink(tmp_path, run_token="r")
    rows = [{"key": k, "window_start": i, "window_end": i + 1} for i, k in enumerate(keys)]
    path = _commit(sink, 1, rows)
    assert pl.read_parquet(path).schema["key"] == pl.String
    assert KEY_IS_INT_METADATA in pl.read_parquet_metadata(path)
    ids = sink.read_ids(sink.committed())
    assert ids["key"].to_list() == [str(k) for k in keys]
    assert ids["__kint"].to_list() == [isinstance(k, int) for k in keys]


def test_types_may_differ_between_epochs(tmp_path: Path) -> None:
    sink = ParquetDirSink(tmp_path, run_token="r")
    a = _commit(sink, 1, [{"key": 1, "window_start": 0, "window_end": 1, "total": 3}])
    b = _commit(sink, 2, [{"key": "k", "window_start": 0, "window_end": 1, "total": 2.5}])
    assert pl.read_parquet(a).schema["total"] == pl.Int64
    assert pl.read_parquet(b).schema["total"] == pl.Float64
    ids = sink.read_ids(sink.committed())
    assert ids.to_dicts() == [
        {"key": "1", "__kint": True, "window_start": 0, "window_end": 1},
        {"key": "k", "__kint": False, "window_start": 0, "window_end": 1},
    ]


def test_several_writes_in_one_epoch_are_relaxed(tmp_path: Path) -> None:
    sink = ParquetDirSink(tmp_path, run_token="r")
    sink.write(1, results_frame([{"key": "a", "window_start": 0, "window_end": 1, "v": 1}]))
    sink.write(1, results_frame([{"key": "b", "window_start": 0, "window_end": 1, "v": 0.5}]))
    sink.write(1, results_frame([{"key": "c", "window_start": 0, "window_end": 1, "v": None}]))
    sink.write(1, results_frame([{"key": 4, "window_start": 0, "window_end": 1, "v": "x"}]))
    (token,) = sink.prepare(1)
    sink.commit(1, [token])
    df = pl.read_parquet(tmp_path / token)
    assert df.schema["v"] == pl.String  # Int64 + Float64 + String conflict -> text
    assert df["key"].to_list() == ["a", "b", "c", "4"]
    assert sink.read_ids(sink.committed())["__kint"].to_list() == [False, False, False, True]


def test_records_role_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="only hold results"):
        ParquetDirSink(tmp_path, "records", "r")
    with pytest.raises(TypeError, match="run_token"):
        ParquetDirSink(tmp_path)


def test_frame_without_identity_columns_is_refused(tmp_path: Path) -> None:
    sink = ParquetDirSink(tmp_path, run_token="r")
    with pytest.raises(ValueError, match="__kint"):
        sink.write(1, pl.DataFrame({"key": ["a"], "window_start": [0], "window_end": [1]}))


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux)")
def test_disk_full_at_prepare(tmp_path: Path) -> None:
    sink = ParquetDirSink(tmp_path, run_token="r")
    staging = tmp_path / ".part-000000000001-r.parquet.inprogress"
    os.symlink("/dev/full", staging)
    sink.write(1, results_frame([{"key": "a", "window_start": 0, "window_end": 1, "v": 1}]))
    with pytest.raises(SinkError) as err:
        sink.prepare(1)
    assert str(err.value) == (
        f"cannot write results to {staging}: [Errno 28] No space left on device"
    )
    assert os.listdir(tmp_path) == []
    with pytest.raises(SinkError, match="No space left"):
        sink.prepare(1)


def test_read_ids_of_a_corrupt_file(tmp_path: Path) -> None:
    sink = ParquetDirSink(tmp_path, run_token="r")
    (tmp_path / "part-000000000001-r.parquet").write_bytes(b"PAR1 not really")
    with pytest.raises(SinkError, match="cannot read results from"):
        sink.read_ids(sink.committed())


def test_a_symlinked_results_file_is_refused(tmp_path: Path) -> None:
    elsewhere = ParquetDirSink(tmp_path / "elsewhere", run_token="r")
    elsewhere.write(1, results_frame(sample_rows("results", 1, n=2)))
    (token,) = elsewhere.prepare(1)
    elsewhere.commit(1, [token])
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / token).symlink_to(tmp_path / "elsewhere" / token)
    sink = ParquetDirSink(tmp_path / "out", run_token="r2")
    with pytest.raises(SinkError, match=r"is a symbolic link, not a results file"):
        sink.committed()
    with pytest.raises(SinkError, match=r"is a symbolic link, not a results file"):
        sink.read_ids([CommittedFile(1, token)])
