"""open_sink, the package surface and the durable-file helpers."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import sealstream.sinks as sinks
from sealstream.errors import SinkError, SpecError
from sealstream.pipeline import Output
from sealstream.sinks import JsonlDirSink, ParquetDirSink, StdoutSink, open_sink
from sealstream.sinks._files import atomic_rename, ensure_dir, os_reason, write_new


def test_all_is_sorted_and_complete() -> None:
    assert sinks.__all__ == sorted(sinks.__all__)
    for name in sinks.__all__:
        assert hasattr(sinks, name)


def test_open_sink_by_kind(tmp_path: Path) -> None:
    out = open_sink(Output(kind="jsonl", path="o", base_dir=tmp_path), "records", "t1")
    assert isinstance(out, JsonlDirSink) and out.role == "records"
    assert (tmp_path / "o").is_dir()
    pq = open_sink(Output(kind="parquet", path="p", base_dir=tmp_path), "results", "t1")
    assert isinstance(pq, ParquetDirSink)
    assert isinstance(open_sink(Output(kind="stdout"), "results", "t1"), StdoutSink)


def test_open_sink_refusals(tmp_path: Path) -> None:
    with pytest.raises(SinkError, match="only hold results"):
        open_sink(Output(kind="parquet", path="p", base_dir=tmp_path), "records", "t1")
    with pytest.raises(SinkError, match="unknown output kind"):
        open_sink(Output(kind="csv", path="p", base_dir=tmp_path), "results", "t1")  # type: ignore[arg-type]
    with pytest.raises(SpecError):
        open_sink(Output(kind="jsonl"), "results", "t1")


def test_write_new_creates_only_if_absent(tmp_path: Path) -> None:
    target = tmp_path / "f.json"
    write_new(target, b"one")
    with pytest.raises(FileExistsError):
        write_new(target, b"two")
    assert target.read_bytes() == b"one"
    assert os.listdir(tmp_path) == ["f.json"]  # no temporary left behind


def test_atomic_rename_and_ensure_dir(tmp_path: Path) -> None:
    d = tmp_path / "a" / "b"
    ensure_dir(d)
    ensure_dir(d)
    (d / ".x").write_bytes(b"data")
    atomic_rename(d / ".x", d / "x")
    assert os.listdir(d) == ["x"] and (d / "x").read_bytes() == b"data"
    with pytest.raises(NotADirectoryError):
        ensure_dir(d / "x")


def test_os_reason() -> None:
    assert os_reason(OSError(28, "No space left on device", "f")) == (
        "[Errno 28] No space left on device"
    )
    assert os_reason(OSError("odd")) == "odd"
