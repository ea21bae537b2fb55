"""The checkpoint store contract on object storage: on a real S3 server (SeaweedFS)
and on local-disk objects; plus what only object storage has to show: the probe of
the server's conditional writes, the single writer's lease and fencing, idempotent
retries told apart from conflicts, and multipart uploads of large state."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path
from typing import Any

import pytest

from sealstream._objects import LocalObjects, ObjectExistsError, Objects, ObjectStoreError
from sealstream._objects.s3 import S3Objects
from sealstream.checkpoint.stores import REJECTED, CheckpointStore, open_store
from sealstream.checkpoint.stores.objects import ObjectCheckpointStore
from sealstream.errors import CheckpointError, LockHeldError, SpecError
from sealstream.testing.store_contract import PIPELINE, StoreContract, sample_checkpoint


def _objects_of(store: CheckpointStore) -> Objects:
    assert isinstance(store, ObjectCheckpointStore)
    return store.objects


class _ObjectContract(StoreContract):
    def tamper(self, store: CheckpointStore, rel: str, data: bytes | None) -> None:
        objects = _objects_of(store)
        objects.delete(rel)  # behind the store's back: remove, then put other bytes
        if data is not None:
            objects.create(rel, data)

    def stored(self, store: CheckpointStore, rel: str) -> bytes | None:
        return _objects_of(store).get(rel)

    def kept_aside(self, store: CheckpointStore, cid: int) -> list[bytes]:
        objects = _objects_of(store)
        keys = [k for k in objects.keys(f"{REJECTED}/cp-{cid:012d}-")
                if not k.rsplit("/", 1)[-1].startswith(".")]
        return [objects.get(k) or b"" for k in keys]


#: the clients S3Objects sends its requests with (SEALSTREAM_S3_CLIENT): every S3
#: test here runs on both; "obstore" fails rather than falls back when it cannot be used
CLIENTS = ["botocore", "obstore"]


@pytest.fixture(params=CLIENTS)
def client(request: Any, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("SEALSTREAM_S3_CLIENT", request.param)
    return str(request.param)


class TestS3Store(_ObjectContract):
    @pytest.fixture(autouse=True)
    def _server(self, s3_server: Any, monkeypatch: pytest.MonkeyPatch, client: str) -> None:
        for name, value in s3_server.env().items():
            monkeypatch.setenv(name, value)
        self.server = s3_server
        self.client = client

    def make_store(self, where: Path, pipeline: str = PIPELINE,
                   key: bytes | None = None) -> CheckpointStore:
        prefix = "t/" + hashlib.sha256(str(where).encode()).hexdigest()[:16]
        objects = S3Objects(self.server.bucket, prefix)
        assert objects.backend == self.client
        return ObjectCheckpointStore(objects, pipeline, encryption_key=key)


class TestLocalObjectsStore(_ObjectContract):
    def make_store(self, where: Path, pipeline: str = PIPELINE,
                   key: bytes | None = None) -> CheckpointStore:
        return ObjectCheckpointStore(LocalObjects(where / "objects"), pipeline,
                                     encryption_key=key)


# ---------------------------------------------------------------- S3 only
@pytest.fixture
def s3_env(s3_server: Any, monkeypatch: pytest.MonkeyPatch, client: str) -> Any:
    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)
    return s3_server


def _url(server: Any, tmp_path: Path) -> str:
    return f"s3://{server.bucket}/" + hashlib.sha256(str(tmp_path).encode()).hexdigest()[:16]


def test_open_store_reads_s3_urls_and_refuses_malformed_ones(s3_env: Any, tmp_path: Path) -> None:
    store = open_store(_url(s3_env, tmp_path), None)
    assert isinstance(store, ObjectCheckpointStore)
    assert store.location == _url(s3_env, tmp_path)
    for bad in ("s3://", "s3://B/x", "s3://bucket/a//b", "s3://bucket/../x"):
        with pytest.raises(SpecError, match="s3://"):
            open_store(bad, None)


def test_idempotent_retry_is_told_apart_from_a_conflict(s3_env: Any, tmp_path: Path) -> None:
    objects = S3Objects.from_url(_url(s3_env, tmp_path))
    assert objects.create("a", b"same") is True
    assert objects.create("a", b"same") is False  # a retry whose first answer was lost
    with pytest.raises(ObjectExistsError, match="other bytes"):
        objects.create("a", b"other")
    assert objects.get("a") == b"same"
    assert objects.get("a", 1, 2) == b"am"
    assert objects.get("a", 10) == b""
    assert objects.get("absent") is None


def test_the_probe_leaves_nothing_and_sweeps_what_killed_probes_left(
        s3_env: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    objects = S3Objects.from_url(_url(s3_env, tmp_path))
    objects.probe()
    assert objects.keys() == []
    # a run SIGKILLed between its probe's create and its delete leaves this behind
    assert objects.create(".probe/left-by-a-killed-run", b"1")
    objects.probe()  # younger than PROBE_STALE_S: it may be a probe still running
    assert objects.keys() == [".probe/left-by-a-killed-run"]
    time.sleep(1.5)  # LastModified has a one-second grain
    monkeypatch.setattr(S3Objects, "PROBE_STALE_S", 0.5)
    objects.probe()
    assert objects.keys() == []


def test_large_state_goes_up_in_parts_and_is_never_overwritten(s3_env: Any, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch,
                                                              client: str) -> None:
    monkeypatch.setattr(S3Objects, "multipart_bytes", 5 * 1024 * 1024)
    objects = S3Objects.from_url(_url(s3_env, tmp_path))
    big = bytes(range(256)) * (11 * 4096)  # 11 MiB: three parts
    assert objects.backend == client
    assert objects.create("big", big) is True
    assert objects.get("big") == big
    assert objects.create("big", big) is False
    with pytest.raises(ObjectExistsError):
        objects.create("big", big[::-1])
    assert hashlib.sha256(objects.get("big") or b"").digest() == hashlib.sha256(big).digest()


def test_two_runs_on_one_prefix_one_is_refused(s3_env: Any, tmp_path: Path) -> None:
    url = _url(s3_env, tmp_path)
    first, second = open_store(url, "p"), open_store(url, "p")
    with first.locked():
        with pytest.raises(LockHeldError, match="locked by another run"), second.locked():
            pass  # pragma: no cover
        files, manifest = sample_checkpoint(1)
        first.write_checkpoint(1, files, manifest)
    with second.locked():
        assert second.ids() == [1]


def test_a_fenced_writer_publishes_nothing_and_says_so(s3_env: Any, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SEALSTREAM_S3_LEASE_S", "1")
    url = _url(s3_env, tmp_path)
    old, new = open_store(url, "p"), open_store(url, "p")
    assert isinstance(old, ObjectCheckpointStore)
    with old.locked():
        old._stop.set()  # the old run stalls: its lease is no longer renewed
        assert old._thread is not None
        old._thread.join()
        import time

        deadline = time.monotonic() + 60
        while new.is_locked() is not None:  # the lease expires (a bounded wait)
            assert time.monotonic() < deadline
            time.sleep(0.2)
        with new.locked():
            files, manifest = sample_checkpoint(1)
            with pytest.raises(LockHeldError, match="fenced.*checkpoint 1 was not published"):
                old.write_checkpoint(1, files, manifest)
            assert not new.has_manifest(1)
            with pytest.raises(LockHeldError, match="fenced"):
                old.check_lock()
            files, manifest = sample_checkpoint(2)
            new.write_checkpoint(2, files, manifest)
            assert new.has_manifest(2)


def test_a_killed_holder_of_this_host_does_not_block_the_next_run(s3_env: Any,
                                                                  tmp_path: Path) -> None:
    import json
    import socket
    import subprocess
    import sys

    url = _url(s3_env, tmp_path)
    store = open_store(url, "p")
    assert isinstance(store, ObjectCheckpointStore)
    store.ensure_root()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    lease = {"holder": {"pid": int(dead.stdout), "host": socket.gethostname(), "run": "x"},
             "generation": 7, "expires_ms": 10**15, "released": False}
    store.objects.replace("LEASE", json.dumps(lease).encode(), None)
    assert store.is_locked() is None
    with store.locked():
        got = store.objects.read_versioned("LEASE")
        assert got is not None and json.loads(got[0])["generation"] == 8


def test_a_server_that_ignores_if_none_match_is_refused(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch,
                                                       client: str) -> None:
    from s3_proxy import HeaderDroppingProxy
    from sealstream.testing.brokers import SeaweedServer

    with SeaweedServer(anonymous=True) as server, \
            HeaderDroppingProxy(server.endpoint, drop=("if-none-match",)) as proxy:
        for name, value in server.env().items():
            monkeypatch.setenv(name, value)
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
        store = open_store(f"s3://{server.bucket}/job", "p")
        with pytest.raises(CheckpointError) as info:
            store.ensure_root()
        text = str(info.value)
        assert "does not honour create-if-absent (If-None-Match: *)" in text
        assert proxy.url.split("//")[1] in text and server.secret_key not in text
        assert not store.exists()
        # the same server reached directly passes the probe
        monkeypatch.setenv("AWS_ENDPOINT_URL", server.endpoint)
        direct = open_store(f"s3://{server.bucket}/job", "p")
        direct.ensure_root()
        assert direct.exists()


def test_a_server_that_is_down_longer_than_the_budget_gives_one_line(
        own_s3: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, client: str) -> None:
    for name, value in own_s3.env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("SEALSTREAM_S3_RETRY_S", "2")
    store = open_store(f"s3://{own_s3.bucket}/job", "p")
    store.ensure_root()
    own_s3.kill()
    files, manifest = sample_checkpoint(1)
    with pytest.raises(CheckpointError) as info:
        store.write_checkpoint(1, files, manifest)
    text = str(info.value)
    assert "did not answer for 2 s" in text and "\n" not in text
    assert own_s3.secret_key not in text and own_s3.access_key not in text
    own_s3.start()  # back: the store goes on where it was
    store.write_checkpoint(2, *sample_checkpoint(2))
    assert store.has_manifest(2)


def test_wrong_credentials_are_one_line_without_the_secret(
        s3_env: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    store = open_store(_url(s3_env, tmp_path), "p")
    with pytest.raises(CheckpointError, match="access denied") as info:
        store.ensure_root()
    assert "not-the-secret" not in str(info.value)


def test_local_objects_are_published_whole_and_create_if_absent(tmp_path: Path) -> None:
    objects = LocalObjects(tmp_path / "o")
    assert objects.create("a/b", b"x") is True
    assert objects.create("a/b", b"x") is False
    with pytest.raises(ObjectExistsError):
        objects.create("a/b", b"y")
    assert objects.keys() == ["a/b"]
    assert [p.name for p in (tmp_path / "o" / "a").iterdir()] == ["b"]


def test_a_multipart_upload_cut_by_a_server_crash_is_never_visible(
        own_s3: Any, monkeypatch: pytest.MonkeyPatch, client: str) -> None:
    """The server is SIGKILLed after the first part of a large object went up: the
    create fails in one line, the object never appears (not even partly) once the
    server is back, and a second attempt stores it whole."""
    for name, value in own_s3.env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("SEALSTREAM_S3_RETRY_S", "2")
    monkeypatch.setattr(S3Objects, "multipart_bytes", 5 * 1024 * 1024)
    big = bytes(range(256)) * (12 * 4096)  # 12 MiB: three parts

    class KilledAfterOnePart(S3Objects):
        parts = 0

        def _call(self, what: str, fn: Any, **kw: Any) -> Any:
            if what.startswith("upload part"):
                KilledAfterOnePart.parts += 1
                if KilledAfterOnePart.parts == 2:
                    own_s3.kill()  # the server dies between two parts
            return super()._call(what, fn, **kw)

    objects = KilledAfterOnePart(own_s3.bucket, "mp")
    assert objects.backend == client  # the parts go up by botocore on both
    with pytest.raises(ObjectStoreError, match="did not answer for 2 s"):
        objects.create("state.arrow", big)
    own_s3.start()
    again = S3Objects(own_s3.bucket, "mp")
    assert again.get("state.arrow") is None
    assert again.keys() == []
    assert again.create("state.arrow", big) is True
    assert again.get("state.arrow") == big


def test_scale_out_parts_written_by_workers_verify_and_are_fenced(s3_env: Any,
                                                                 tmp_path: Path) -> None:
    """A claimed checkpoint gets parts from other processes' stores (workers), create-if-
    absent; the coordinator's manifest binds them and the guard passes the whole. Once
    another run took the lease, a worker holding the old fence adds nothing."""
    import json

    import polars as pl

    from sealstream.checkpoint import guard
    from sealstream.checkpoint.manifest import part_name, seal
    from sealstream.checkpoint.stores import checkpoint_dirname
    from sealstream.state.codec import WATERMARK_META, encode_table, sha256_hex
    from sealstream.testing.store_contract import SIGNING_KEY

    url = _url(s3_env, tmp_path)
    store = open_store(url, PIPELINE)
    parts = {i: encode_table(pl.DataFrame({"key": [f"k{i}"], "n": [i]}),
                             {WATERMARK_META.decode(): {"global_ms": 1}}) for i in range(2)}
    with store.locked():
        store.claim(1)
        fence = store.fence()
        worker = open_store(url, PIPELINE)  # as in another process
        for i, data in parts.items():
            worker.write_part(1, part_name(i), data, fence)
        worker.write_part(1, part_name(0), parts[0], fence)  # a retry: the same bytes
        with pytest.raises(CheckpointError, match="other bytes"):
            worker.write_part(1, part_name(0), parts[1], fence)
        files, manifest = sample_checkpoint(1)
        body = json.loads(manifest)
        d = checkpoint_dirname(1)
        for i, data in parts.items():
            body["files"][f"part:{i}"] = {"path": f"{d}/{part_name(i)}",
                                          "sha256": sha256_hex(data), "bytes": len(data)}
        body.pop("signature")
        store.write_checkpoint(1, files, seal(body, SIGNING_KEY), claimed=True)
        with pytest.raises(CheckpointError, match="already published"):
            worker.write_part(1, part_name(2), parts[0], fence)
        policy = guard.Policy(key=SIGNING_KEY, pipeline=PIPELINE)
        assert guard.judge(store.evidence(1, SIGNING_KEY), None, policy).ok
        store.claim(2)
    # the run ended (its lease released) and another took it: the old fence is stale
    with open_store(url, PIPELINE).locked():
        with pytest.raises(LockHeldError, match="no longer holds the lease"):
            worker.write_part(2, part_name(0), parts[0], fence)
        assert store.files_of(2) == []
