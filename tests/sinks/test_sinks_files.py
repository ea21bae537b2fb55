"""open_sink, the package surface and the durable-file helpers."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import sealstream.sinks as sinks
from sealstream.errors import SinkError, SpecError
from sealstream.pipeline import Output
from sealstream.sinks import JsonlDirSink, ParquetDirSink, StdoutSink, open_sink
from sealstream.sinks._files import (
    StagedDirSink,
    atomic_rename,
    ensure_dir,
    os_reason,
    write_new,
)
from sealstream.testing.sink_contract import results_frame, sample_rows


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


# ---------------------------------------------------------------- an output that moved
def _staged(path: Path, run: str, epoch: int,
            cls: type[StagedDirSink] = JsonlDirSink) -> tuple[StagedDirSink, list[str]]:
    sink = cls(path, "results", run)
    sink.write(epoch, results_frame(sample_rows("results", epoch, n=3)))
    return sink, sink.prepare(epoch)


@pytest.mark.parametrize("cls", [JsonlDirSink, ParquetDirSink])
def test_recover_at_commits_where_the_epoch_was_staged(
    tmp_path: Path, cls: type[StagedDirSink]
) -> None:
    old, new = tmp_path / "out", tmp_path / "out2"
    first, t1 = _staged(old, "runA", 1, cls)
    first.commit(1, t1)
    _, t2 = _staged(old, "runA", 2, cls)  # prepared, the checkpoint published, then killed
    _staged(old, "runA", 3, cls)  # the next epoch, staged and never checkpointed
    foreign = old / f".part-000000000009-other.{cls.ext}.inprogress"
    foreign.write_bytes(b"another job's staging")
    sink = cls(new, "results", "runB")
    assert sink.location() == str(new.resolve())
    sink.recover_at(str(old.resolve()), {2: t2})
    names = sorted(os.listdir(old))
    assert names == sorted([foreign.name, *t1, *t2])  # runA's epoch 3 staging is gone
    assert os.listdir(new) == []
    # what the earlier directory holds is committed output of this sink now
    listed = sink.committed()
    assert [(c.epoch, c.token, c.location) for c in listed] == [
        (1, t1[0], str(old.resolve())), (2, t2[0], str(old.resolve()))]
    assert sink.read_ids(listed).height == 6
    # idempotent: a second recovery (say, after another kill) finds it committed
    cls(new, "results", "runC").recover_at(str(old.resolve()), {2: t2})
    assert sorted(os.listdir(old)) == names


def test_recover_at_finds_a_moved_directory_here(tmp_path: Path) -> None:
    old, new = tmp_path / "out", tmp_path / "moved"
    _, t1 = _staged(old, "runA", 1)
    old.rename(new)
    sink = JsonlDirSink(new, "results", "runB")
    sink.recover_at(str(old), {1: t1})
    assert os.listdir(new) == t1
    assert not old.exists()  # the recorded directory is never created


def test_recover_at_refusals(tmp_path: Path) -> None:
    sink = JsonlDirSink(tmp_path / "new", "results", "runB")
    with pytest.raises(SinkError, match=r"staged neither in .*/old \(where the checkpoint "
                                         r"staged it\) nor in .*/new; prepared output was"):
        sink.recover_at(str(tmp_path / "old"), {4: ["part-000000000004-runA.jsonl"]})
    for bad in ("out", 7, ["x"]):
        with pytest.raises(SinkError, match="expected an absolute path"):
            sink.recover_at(bad, {})
    # no recorded path (an older checkpoint) or the same one: a plain recover
    with pytest.raises(SinkError, match="neither .*/new/.part-000000000004"):
        sink.recover_at(None, {4: ["part-000000000004-runA.jsonl"]})
    sink.recover_at(sink.location(), {})
    assert sink.committed() == []


def test_stdout_sink_has_no_location() -> None:
    sink = StdoutSink("results")
    assert sink.location() is None
    sink.recover_at("/anywhere", {1: ["stdout-000000000001"]})  # ignored
