"""What a checkpoint costs in S3 requests, on a real server (SeaweedFS), and why the
savings keep the protocol: under its lease the writer lists its prefix once and then
knows its ids, names and plans; it verifies the newest checkpoint from the bytes the
server acknowledged; a retention deletion is a marker, the manifest, one batch and
the claim; outside the lease every answer comes from the bucket again; a large object's
parts go up concurrently and it is never visible unless whole, also when its writer is
SIGKILLed in the middle."""

from __future__ import annotations

import collections
import hashlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from sealstream._objects.s3 import S3Objects
from sealstream.checkpoint import guard
from sealstream.checkpoint.stores import checkpoint_dirname
from sealstream.checkpoint.stores.objects import DELETING, ObjectCheckpointStore
from sealstream.testing.store_contract import PIPELINE, SIGNING_KEY, sample_checkpoint


@pytest.fixture
def s3_env(s3_server: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)
    # the requests are counted from botocore's event hooks: the botocore client
    # (SEALSTREAM_S3_CLIENT), which sends the same requests as obstore for each call
    monkeypatch.setenv("SEALSTREAM_S3_CLIENT", "botocore")
    return s3_server


def _prefix(tmp_path: Path) -> str:
    return "req/" + hashlib.sha256(str(tmp_path).encode()).hexdigest()[:16]


class Counted:
    """The S3 requests a store's client sends, by operation (botocore's own event
    hooks on the real client: nothing is replaced)."""

    def __init__(self, objects: S3Objects) -> None:
        self.calls: collections.Counter[str] = collections.Counter()
        objects.client.meta.events.register("before-call.s3", self._seen)

    def _seen(self, model: Any, **_: Any) -> None:
        self.calls[model.name] += 1

    def take(self) -> collections.Counter[str]:
        out, self.calls = self.calls, collections.Counter()
        return out


def _store(s3_env: Any, tmp_path: Path) -> tuple[ObjectCheckpointStore, Counted]:
    objects = S3Objects(s3_env.bucket, _prefix(tmp_path))
    return ObjectCheckpointStore(objects, PIPELINE, encryption_key=None), Counted(objects)


def reader_view(store: ObjectCheckpointStore, cid: int) -> list[str]:
    """``files_of(cid)`` as a store without the lease answers it (from the bucket)."""
    return ObjectCheckpointStore(store.objects, PIPELINE, encryption_key=None).files_of(cid)


def _checkpoint_and_retain(store: ObjectCheckpointStore, cid: int, keep: int) -> None:
    """What the engine does per checkpoint: write it, verify it, read the manifests
    of the ones it keeps, delete the oldest beyond ``keep``."""
    files, manifest = sample_checkpoint(cid, cid - 1 if cid > 1 else None)
    store.write_checkpoint(cid, files, manifest)
    policy = guard.Policy(key=SIGNING_KEY, pipeline=PIPELINE)
    assert guard.judge(store.evidence(cid, SIGNING_KEY), None, policy).ok
    assert store.verified_parent(cid, SIGNING_KEY) is not None or cid == 1
    ids = store.ids()
    for old in ids:
        store.files_of(old)
    for old in ids[:-keep]:
        store.delete(old)
    store._settle()  # the deletions run behind the caller: count them with this one
    store.plan_steps()


def test_a_checkpoint_under_the_lease_lists_nothing_and_reads_nothing_back(
        s3_env: Any, tmp_path: Path) -> None:
    store, counted = _store(s3_env, tmp_path)
    with store.locked():
        _checkpoint_and_retain(store, 1, keep=2)
        counted.take()  # the start: the probe, the lease and the one listing
        for cid in range(2, 7):
            _checkpoint_and_retain(store, cid, keep=2)
            calls = counted.take()
            assert calls["ListObjectsV2"] == 0, calls
            assert calls["GetObject"] == 0, calls  # verified from what the server acked
            assert calls["HeadObject"] == 0, calls
            # claim, state, receipts, lease, manifest; then the deletion of the oldest:
            # its marker, its manifest, one batch (state, receipts), its claim, the marker
            deleted = cid > 2
            assert calls["PutObject"] == 5 + deleted, calls
            assert calls["DeleteObjects"] == deleted and calls["DeleteObject"] == 3 * deleted, \
                calls
        assert store.ids() == [5, 6]
        assert store.files_of(6) == reader_view(store, 6)
    with store.locked():  # the next run: deletes what the previous one wrote
        assert store.ids() == [5, 6]
        for cid in (7, 8):
            _checkpoint_and_retain(store, cid, keep=2)
        assert store.ids() == [7, 8]
    # what it left is what a reader of the bucket finds: no trace of the deleted ones
    reader, _ = _store(s3_env, tmp_path)
    assert reader.ids() == [7, 8]
    assert [k for k in reader.objects.keys("cp-") if k.split("/")[0] < "cp-000000000007"] == []
    assert reader.objects.keys(DELETING) == []
    policy = guard.Policy(key=SIGNING_KEY, pipeline=PIPELINE)
    for cid in (7, 8):
        assert guard.judge(reader.evidence(cid, SIGNING_KEY), None, policy).ok


def test_without_the_lease_every_answer_comes_from_the_bucket(s3_env: Any,
                                                               tmp_path: Path) -> None:
    """A reader (no lease: ``checkpoints list``, a console) sees what a writer did since
    its last question, and a damaged object as damaged; so does the next run, whose
    view starts from a listing taken once it holds the lease."""
    writer, _ = _store(s3_env, tmp_path)
    reader, counted = _store(s3_env, tmp_path)
    with writer.locked():
        _checkpoint_and_retain(writer, 1, keep=3)
        assert reader.ids() == [1]
        _checkpoint_and_retain(writer, 2, keep=3)
        assert reader.ids() == [1, 2]
    assert counted.take()["ListObjectsV2"] >= 2
    rel = f"{checkpoint_dirname(2)}/state.arrow"
    data = reader.objects.get(rel)
    assert data is not None
    reader.objects.delete(rel)  # behind the store's back
    reader.objects.create(rel, data[: len(data) // 2])
    policy = guard.Policy(key=SIGNING_KEY, pipeline=PIPELINE)
    assert guard.judge(reader.evidence(2, SIGNING_KEY), None, policy).verdict \
        == "PARTIAL_CHECKPOINT_REJECT"
    with writer.locked():  # a new run's view: read again from the bucket
        assert writer.ids() == [1, 2]
        assert guard.judge(writer.evidence(2, SIGNING_KEY), None, policy).verdict \
            == "PARTIAL_CHECKPOINT_REJECT"
        writer.move_aside(2, "test")
        assert writer.ids() == [1]
    assert reader.ids() == [1]


_UPLOADER = """
import sys
from sealstream._objects.s3 import S3Objects
S3Objects.multipart_bytes = 5 * 1024 * 1024
objects = S3Objects(sys.argv[1], sys.argv[2])
big = bytes(range(256)) * (21 * 4096)  # 21 MiB: five parts, four at a time
print("uploading", flush=True)
objects.create("state.arrow", big)
print("created", flush=True)
"""


@pytest.mark.parametrize("client", ["botocore", "obstore"])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_sigkill_during_concurrent_part_uploads_leaves_nothing_visible(
        s3_env: Any, tmp_path: Path, seed: int, client: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A writer SIGKILLed at a random instant while the parts of a large object go up
    concurrently: the object is absent or whole, never part of it; a second writer
    then creates it (or finds the same bytes: an idempotent retry), and its upload
    left open is never visible as an object."""
    import random

    monkeypatch.setenv("SEALSTREAM_S3_CLIENT", client)  # the parts: botocore on both
    big = bytes(range(256)) * (21 * 4096)
    prefix = f"{_prefix(tmp_path)}-{seed}"
    with subprocess.Popen([sys.executable, "-c", _UPLOADER, s3_env.bucket, prefix],
                          stdout=subprocess.PIPE, text=True, env={**os.environ}) as proc:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "uploading"
        time.sleep(random.Random(seed).uniform(0.0, 0.6))  # the instant, not the verdict
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=60)
    objects = S3Objects(s3_env.bucket, prefix)
    there = objects.get("state.arrow")
    assert there is None or there == big
    assert objects.keys() == ([] if there is None else ["state.arrow"])
    monkey = S3Objects(s3_env.bucket, prefix)
    monkey.multipart_bytes = 5 * 1024 * 1024
    assert monkey.create("state.arrow", big) is (there is None)
    assert objects.get("state.arrow") == big
    assert objects.keys() == ["state.arrow"]
