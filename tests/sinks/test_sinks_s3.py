"""The sink contract on S3 (a real SeaweedFS server): JSON Lines results and records,
Parquet results at ``s3://bucket/prefix``; plus what only object storage can do
wrong: another job's bytes under a final key, an idempotent re-commit, a server that
ignores If-None-Match, credentials kept out of errors."""

from __future__ import annotations

import fnmatch
import hashlib
from pathlib import Path
from typing import Any

import pytest

from sealstream._objects.s3 import S3Objects
from sealstream.errors import SinkError
from sealstream.sinks import Sink
from sealstream.sinks.objects import JsonlObjectSink, ParquetObjectSink
from sealstream.testing.sink_contract import SinkContract, results_frame, sample_rows


def s3_objects(server: Any, prefix: str) -> S3Objects:
    import boto3

    client = boto3.client("s3", endpoint_url=server.endpoint, region_name="us-east-1",
                          aws_access_key_id=server.access_key,
                          aws_secret_access_key=server.secret_key)
    return S3Objects(server.bucket, prefix, server.endpoint, client=client)


class S3Places:
    """The contract's directories mapped to prefixes of the test server's bucket."""

    server: Any = None

    @pytest.fixture(autouse=True)
    def _server(self, s3_server: Any) -> None:
        self.server = s3_server

    def objects(self, path: Path) -> S3Objects:
        return s3_objects(self.server, "contract-" + hashlib.sha1(str(path).encode()).hexdigest())

    def names(self, path: Path) -> list[str]:
        return [k for k in self.objects(path).keys() if "/" not in k]

    def read_name(self, path: Path, name: str) -> bytes:
        data = self.objects(path).get(name)
        assert data is not None, name
        return data

    def remove_name(self, path: Path, name: str) -> None:
        self.objects(path).delete(name)

    def put_name(self, path: Path, name: str, data: bytes) -> None:
        self.objects(path).create(name + ".keep" if name.endswith("/") else name, data)

    def has_name(self, path: Path, name: str) -> bool:
        return bool(self.objects(path).keys(name))

    def is_place(self, path: Path) -> bool:
        return True  # a prefix needs no creating

    def visible_files(self, path: Path) -> list[str]:
        glob = getattr(self, "visible_glob", "*")
        return [n for n in self.names(path) if fnmatch.fnmatchcase(n, glob)
                and not n.startswith(".")]


class TestS3JsonlResultsContract(S3Places, SinkContract):
    role = "results"
    visible_glob = "*.jsonl"

    def make_sink(self, path: Path, run_token: str) -> Sink:
        return JsonlObjectSink(self.objects(path), "results", run_token)


class TestS3JsonlRecordsContract(S3Places, SinkContract):
    role = "records"
    visible_glob = "*.jsonl"

    def make_sink(self, path: Path, run_token: str) -> Sink:
        return JsonlObjectSink(self.objects(path), "records", run_token)


class TestS3ParquetResultsContract(S3Places, SinkContract):
    role = "results"
    visible_glob = "*.parquet"

    def make_sink(self, path: Path, run_token: str) -> Sink:
        return ParquetObjectSink(self.objects(path), "results", run_token)


def test_other_bytes_under_the_final_key_are_a_conflict(s3_server: Any) -> None:
    """A commit never overwrites: other bytes under its final key stop it in one line,
    the same bytes (a commit whose answer was lost) are an idempotent retry."""
    objects = s3_objects(s3_server, "conflict")
    sink = JsonlObjectSink(objects, "results", "run1")
    sink.write(4, results_frame(sample_rows("results", 4)))
    tokens = sink.prepare(4)
    staged = objects.get(sink.staging_name(tokens[0]))
    assert staged is not None
    objects.create(tokens[0], b'{"someone":"else"}\n')
    with pytest.raises(SinkError, match="exists with other bytes.*nothing was overwritten"):
        sink.commit(4, tokens)
    assert objects.get(tokens[0]) == b'{"someone":"else"}\n'

    again = s3_objects(s3_server, "retry")
    sink = JsonlObjectSink(again, "results", "run1")
    sink.write(4, results_frame(sample_rows("results", 4)))
    tokens = sink.prepare(4)
    staged = again.get(sink.staging_name(tokens[0]))
    assert staged is not None
    again.create(tokens[0], staged)  # the first commit's create landed, its answer lost
    sink.commit(4, tokens)
    assert again.get(tokens[0]) == staged
    assert again.keys(".part-") == []
