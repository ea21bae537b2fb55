"""StdoutSink: prints at commit, remembers nothing."""

from __future__ import annotations

import io

import polars as pl
import pytest

from sealstream.errors import SinkError
from sealstream.sinks import StdoutSink, id_schema
from sealstream.testing.sink_contract import records_frame, results_frame, sample_rows


def test_prints_only_at_commit(capsys: pytest.CaptureFixture[str]) -> None:
    sink = StdoutSink("results")
    frame = results_frame(sample_rows("results", 1))
    sink.write(1, frame)
    sink.write(1, frame.head(1))
    tokens = sink.prepare(1)
    assert tokens == ["stdout-000000000001"]
    assert capsys.readouterr().out == ""
    sink.commit(1, tokens)
    lines = [*frame["__json"], frame["__json"][0]]
    assert capsys.readouterr().out == "".join(x + "\n" for x in lines)
    sink.commit(1, tokens)
    assert capsys.readouterr().out == ""


def test_empty_epoch_and_recover(capsys: pytest.CaptureFixture[str]) -> None:
    sink = StdoutSink("records")
    assert sink.prepare(3) == []
    sink.write(4, records_frame(sample_rows("records", 4)))
    sink.recover({4: ["stdout-000000000004"]})
    sink.commit(4, ["stdout-000000000004"])
    assert capsys.readouterr().out == ""
    assert sink.committed() == []
    ids = sink.read_ids([])
    assert ids.height == 0 and ids.schema == pl.Schema(id_schema("records"))


class _Broken(io.StringIO):
    def write(self, s: str) -> int:
        raise BrokenPipeError(32, "Broken pipe")


def test_broken_pipe_becomes_sink_error() -> None:
    sink = StdoutSink("results", stream=_Broken())
    sink.write(1, results_frame(sample_rows("results", 1)))
    with pytest.raises(SinkError, match=r"standard output: \[Errno 32\] Broken pipe"):
        sink.commit(1, sink.prepare(1))
