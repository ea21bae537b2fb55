"""The S3 client on botocore's S3 model trimmed to the operations the objects layer
calls, kept in a cache file between runs (sealstream._objects._boto), on a real
server (SeaweedFS): the second client parses neither botocore's S3 model nor its
endpoints; every operation still works (multipart, batch deletes, compare-and-swap,
the probe); a damaged or foreign cache file is made again; models from elsewhere than
botocore's own data are not trimmed."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import botocore.loaders
import pytest

from sealstream._objects import ObjectExistsError, VersionConflictError
from sealstream._objects._boto import OPERATIONS
from sealstream._objects.s3 import S3Objects


@pytest.fixture
def s3_env(s3_server: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Any:
    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("SEALSTREAM_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("AWS_DATA_PATH", raising=False)
    # every operation on the botocore client (with the environment's credentials the
    # obstore client would send all but the multipart ones)
    monkeypatch.setenv("SEALSTREAM_S3_CLIENT", "botocore")
    return s3_server


def _objects(server: Any, tmp_path: Path, multipart_bytes: int | None = None) -> S3Objects:
    prefix = "client/" + hashlib.sha256(str(tmp_path).encode()).hexdigest()[:16]
    objects = S3Objects(server.bucket, prefix)
    if multipart_bytes is not None:
        objects.multipart_bytes = multipart_bytes
    return objects


class Parsed:
    """The data files botocore's loader parses (its own file loader, called through)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.paths: list[str] = []
        original = botocore.loaders.JSONFileLoader.load_file

        def load_file(loader: Any, path: str) -> Any:
            self.paths.append(path)
            return original(loader, path)

        monkeypatch.setattr(botocore.loaders.JSONFileLoader, "load_file", load_file)

    def of_s3(self) -> list[str]:
        return [p for p in self.paths
                if "/s3/" in p or p.endswith(("/endpoints", "/endpoints.json"))]


def _use_every_operation(objects: S3Objects) -> None:
    """Every operation the objects layer sends, against the server."""
    objects.probe()  # PutObject (If-None-Match, If-Match), ListObjectsV2, DeleteObject
    assert objects.create("a", b"1") is True
    assert objects.create("a", b"1") is False  # an idempotent retry
    with pytest.raises(ObjectExistsError):
        objects.create("a", b"2")
    assert objects.get("a") == b"1"
    assert objects.get("a", 0, 1) == b"1"
    assert objects.head("a") is not None and objects.head("a")[0] == 1  # type: ignore[index]
    big = bytes(range(256)) * (6 * 1024 * 1024 // 256 + 1)  # 3 parts of 5 MiB at most
    assert objects.create("big", big) is True  # multipart: create, parts, complete
    assert objects.get("big") == big
    version = objects.replace("lease", b"x", None)
    objects.replace("lease", b"y", version)
    with pytest.raises(VersionConflictError):
        objects.replace("lease", b"z", version)
    assert objects.keys() == ["a", "big", "lease"]
    objects.delete_many(["a", "big"])  # DeleteObjects (its checksum header included)
    objects.delete("lease")
    assert objects.keys() == []


def test_second_client_reads_the_trimmed_model_from_the_cache(
        s3_env: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = _objects(s3_env, tmp_path, multipart_bytes=5 * 1024 * 1024)
    _use_every_operation(first)
    made = list((tmp_path / "cache").glob("botocore-s3-*.json"))
    assert len(made) == 1, "the trimmed model is kept for the next runs"
    doc = json.loads(made[0].read_bytes())
    assert set(doc["models"]["service-2"]["operations"]) == OPERATIONS
    assert [set(p["services"]) for p in doc["endpoints"]["partitions"]] \
        == [{"s3"}] * len(doc["endpoints"]["partitions"])

    parsed = Parsed(monkeypatch)
    second = _objects(s3_env, tmp_path, multipart_bytes=5 * 1024 * 1024)
    _use_every_operation(second)
    assert parsed.of_s3() == [], "botocore's S3 model and endpoints are not parsed again"
    assert not hasattr(second.client, "list_buckets")  # the trimmed model: our operations


def test_damaged_or_foreign_cache_is_made_again(
        s3_env: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _objects(s3_env, tmp_path).client  # noqa: B018 - makes the cache file
    (path,) = (tmp_path / "cache").glob("botocore-s3-*.json")
    good = path.read_bytes()
    doc = json.loads(good)
    extra = json.loads(good)
    extra["models"]["service-2"]["operations"]["ListBuckets"] = \
        doc["models"]["service-2"]["operations"]["ListObjectsV2"]
    for damaged in (good[: len(good) // 2], b"[]", json.dumps(extra).encode(),
                    json.dumps({**doc, "botocore": "0.0.1"}).encode()):
        path.write_bytes(damaged)
        parsed = Parsed(monkeypatch)
        objects = _objects(s3_env, tmp_path)
        assert objects.create("k", b"v") is True
        objects.delete("k")
        assert any("/s3/" in p for p in parsed.paths), "made again from botocore's data"
        assert json.loads(path.read_bytes()) == doc
        assert not hasattr(objects.client, "list_buckets")


def test_models_from_elsewhere_are_not_trimmed(
        s3_env: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_DATA_PATH", str(tmp_path / "models"))
    objects = _objects(s3_env, tmp_path)
    assert hasattr(objects.client, "list_buckets")  # botocore's whole model
    assert objects.create("k", b"v") is True
    objects.delete("k")
    assert not (tmp_path / "cache").exists()


def test_cache_that_cannot_be_written_is_no_error(
        s3_env: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "file").write_text("not a directory")
    monkeypatch.setenv("SEALSTREAM_CACHE_DIR", str(tmp_path / "file" / "cache"))
    _use_every_operation(_objects(s3_env, tmp_path, multipart_bytes=5 * 1024 * 1024))
    monkeypatch.setenv("SEALSTREAM_CACHE_DIR", "")  # turned off: trimmed, nothing kept
    objects = _objects(s3_env, tmp_path)
    assert not hasattr(objects.client, "list_buckets")
    assert objects.create("k", b"v") is True
    objects.delete("k")
