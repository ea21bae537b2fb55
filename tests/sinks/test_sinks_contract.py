"""The reusable sink contract, run against every durable sink and role."""

from __future__ import annotations

from pathlib import Path

from sealstream.sinks import JsonlDirSink, ParquetDirSink, Sink
from sealstream.testing.sink_contract import SinkContract


class TestJsonlResultsContract(SinkContract):
    role = "results"
    visible_glob = "*.jsonl"

    def make_sink(self, path: Path, run_token: str) -> Sink:
        return JsonlDirSink(path, "results", run_token)


class TestJsonlRecordsContract(SinkContract):
    role = "records"
    visible_glob = "*.jsonl"

    def make_sink(self, path: Path, run_token: str) -> Sink:
        return JsonlDirSink(path, "records", run_token)


class TestParquetResultsContract(SinkContract):
    role = "results"
    visible_glob = "*.parquet"

    def make_sink(self, path: Path, run_token: str) -> Sink:
        return ParquetDirSink(path, "results", run_token)
