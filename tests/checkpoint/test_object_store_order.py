"""The order of an S3 checkpoint store's requests where they run concurrently or
behind the caller, on a real server (SeaweedFS), recorded from botocore's own event
hooks on the real client (nothing is replaced):

* at the start, the probe runs beside the reads of STORE and LEASE, and nothing is
  written before it passed; one listing then answers the ids, the plans, the
  deletions under way and the largest id ever taken;
* a checkpoint's claim, files and lease renewal go up concurrently, and its manifest
  is sent only once they all ended, within a third of the lease's term after a
  renewal was sent (renewed again when the files took longer);
* the retention's deletions run on the background thread, each after the manifest
  that made its checkpoint old, and all of them end before the lease is released.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from sealstream._objects.s3 import S3Objects
from sealstream.checkpoint.stores import checkpoint_dirname
from sealstream.checkpoint.stores.objects import DELETING, LEASE_KEY, ObjectCheckpointStore
from sealstream.errors import CheckpointError
from sealstream.testing.store_contract import PIPELINE, sample_checkpoint


@pytest.fixture
def s3_env(s3_server: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)
    # the requests are recorded from botocore's event hooks: the botocore client
    # (SEALSTREAM_S3_CLIENT), which sends the same requests as obstore for each call
    monkeypatch.setenv("SEALSTREAM_S3_CLIENT", "botocore")
    return s3_server


@dataclass
class Request:
    op: str
    key: str  # relative to the store's prefix ("" when the request names none)
    thread: str
    start: float
    end: float = float("inf")  # not answered (yet)


class Recorded:
    """Every request of a store's client: operation, key, thread, when it was sent
    and when its answer came (a thread sends one request at a time)."""

    def __init__(self, objects: S3Objects) -> None:
        self.base = f"{objects.prefix}/" if objects.prefix else ""
        self.requests: list[Request] = []
        self._current: dict[int, Request] = {}
        self._lock = threading.Lock()
        events = objects.client.meta.events
        events.register("before-parameter-build.s3", self._sent)
        events.register("after-call.s3", self._answered)
        events.register("after-call-error.s3", self._answered)

    def _sent(self, params: dict[str, Any], model: Any, **_: Any) -> None:
        key = str(params.get("Key") or params.get("Prefix") or "")
        req = Request(model.name, key[len(self.base):], threading.current_thread().name,
                      time.monotonic())
        with self._lock:
            self.requests.append(req)
            self._current[threading.get_ident()] = req

    def _answered(self, **_: Any) -> None:
        with self._lock:
            req = self._current.pop(threading.get_ident(), None)
        if req is not None:
            req.end = time.monotonic()

    def find(self, op: str, key: str) -> list[Request]:
        return [r for r in self.requests if r.op == op and r.key == key]

    def one(self, op: str, key: str) -> Request:
        got = self.find(op, key)
        assert len(got) == 1, (op, key, self.requests)
        return got[0]


def _store(s3_env: Any, tmp_path: Path, name: str = "") -> tuple[ObjectCheckpointStore,
                                                                  Recorded]:
    prefix = "order/" + hashlib.sha256(f"{tmp_path}{name}".encode()).hexdigest()[:16]
    objects = S3Objects(s3_env.bucket, prefix)
    return ObjectCheckpointStore(objects, PIPELINE, encryption_key=None), Recorded(objects)


def test_the_start_probes_beside_its_reads_writes_after_it_and_lists_once(
        s3_env: Any, tmp_path: Path) -> None:
    store, rec = _store(s3_env, tmp_path)
    with store.locked():
        store.clear_trash()  # what a run's recovery asks, then the id it goes on from
        assert store.ids() == [] and store.plan_steps() == [] and store.max_id_ever() == 0
        started = list(rec.requests)
    probe_puts = [r for r in started if r.op == "PutObject" and r.key.startswith(".probe/")]
    assert len(probe_puts) == 3
    verdict = max(r.end for r in probe_puts)  # both refusals answered
    # nothing of the store is written before the probe passed
    writes = [r for r in started if r.op == "PutObject" and not r.key.startswith(".probe/")]
    assert sorted(r.key for r in writes) == [LEASE_KEY, "STORE"]
    assert all(w.start >= verdict for w in writes), started
    # the probe ran beside the first reads, on another thread
    assert {r.thread for r in probe_puts} != {"MainThread"}
    reads = [rec.one("GetObject", "STORE"), rec.one("GetObject", LEASE_KEY)]
    assert all(r.thread == "MainThread" for r in reads)
    # one listing of the prefix (after the lease was taken) besides the probe's own
    lists = [r for r in started if r.op == "ListObjectsV2"]
    assert sorted(r.key for r in lists) == ["", ".probe/"], lists
    survey = next(r for r in lists if r.key == "")
    taken = next(r for r in writes if r.key == LEASE_KEY)
    assert survey.start >= taken.end
    assert len(started) == 10, [(r.op, r.key) for r in started]  # 16 before


def test_a_server_that_ignores_if_none_match_gets_nothing_written_by_a_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The probe runs beside the first reads: neither STORE nor LEASE may be written
    before it has passed (a lease taken on such a server would mean nothing)."""
    from s3_proxy import HeaderDroppingProxy
    from sealstream.testing.brokers import SeaweedServer

    with SeaweedServer(anonymous=True) as server, \
            HeaderDroppingProxy(server.endpoint, drop=("if-none-match",)) as proxy:
        for name, value in server.env().items():
            monkeypatch.setenv(name, value)
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
        store = ObjectCheckpointStore(S3Objects(server.bucket, "job"), "p")
        with pytest.raises(CheckpointError, match=r"does not honour create-if-absent"), \
                store.locked():
            pass  # pragma: no cover
        assert store.objects.keys() == []


def test_a_prefix_with_rejected_copies_and_a_deletion_under_way_is_read_in_one_listing(
        s3_env: Any, tmp_path: Path) -> None:
    store, _ = _store(s3_env, tmp_path)
    with store.locked():
        for cid in (1, 2, 3):
            files, manifest = sample_checkpoint(cid, cid - 1 if cid > 1 else None)
            store.write_checkpoint(cid, files, manifest)
        store.move_aside(3, "test")
    # a run killed in the middle of deleting checkpoint 1: marked, manifest gone
    d1 = checkpoint_dirname(1)
    store.objects.create(f"{DELETING}{d1}", b"")
    store.objects.delete(f"{d1}/MANIFEST.json")
    reader, _ = _store(s3_env, tmp_path)  # no lease: every answer from listings
    assert reader.ids() == [2] and reader.max_id_ever() == 3
    again, rec = _store(s3_env, tmp_path)
    with again.locked():
        assert again.ids() == [2] and again.max_id_ever() == 3
        assert again.files_of(2) == reader.files_of(2)
        again.clear_trash()
        assert again.ids() == [2]
    assert [r.key for r in rec.requests if r.op == "ListObjectsV2"] == [".probe/", ""]
    assert again.objects.keys(f"{d1}/") == [] and again.objects.keys(DELETING) == []
    assert reader.ids() == [2] and reader.max_id_ever() == 3


def test_the_manifest_follows_the_claim_files_and_renewal_which_go_up_together(
        s3_env: Any, tmp_path: Path) -> None:
    store, rec = _store(s3_env, tmp_path)
    with store.locked():
        for cid in (1, 2, 3):
            before = len(rec.requests)
            files, manifest = sample_checkpoint(cid, cid - 1 if cid > 1 else None)
            store.write_checkpoint(cid, files, manifest)
            mine = rec.requests[before:]
            d = checkpoint_dirname(cid)
            published = rec.one("PutObject", f"{d}/MANIFEST.json")
            rest = [r for r in mine if r is not published]
            assert sorted(r.key for r in rest) == sorted(
                [LEASE_KEY, f"{d}/.claim", *(f"{d}/{n}" for n in files)]), rest
            assert all(r.end <= published.start for r in rest), mine
            assert all(r.thread.startswith("sealstream-s3put") for r in rest), rest


def test_files_slower_than_a_third_of_the_lease_are_followed_by_another_renewal(
        s3_env: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The renewal goes up beside the files; when they take longer than a third of
    the lease's term, the lease is renewed again before the manifest, so that the
    manifest is always sent within a third of the term after a renewal was sent."""
    monkeypatch.setenv("SEALSTREAM_S3_LEASE_S", "1.5")
    store, rec = _store(s3_env, tmp_path)
    with store.locked():
        store._stop.set()  # no heartbeat: the writer's renewals are the only ones
        assert store._thread is not None
        store._thread.join()

        def slow_files(point: str) -> None:
            if point == "after_write_state":  # the files take longer than 0.5 s
                time.sleep(0.8)

        files, manifest = sample_checkpoint(1)
        before = len(rec.requests)
        store.write_checkpoint(1, files, manifest, crash=slow_files)
        mine = rec.requests[before:]
        published = rec.one("PutObject", f"{checkpoint_dirname(1)}/MANIFEST.json")
        renewals = [r for r in mine if r.op == "PutObject" and r.key == LEASE_KEY]
        assert len(renewals) == 2, mine  # beside the files, and again after them
        last = max(renewals, key=lambda r: r.start)
        assert last.end <= published.start
        assert published.start - last.start < 0.5
        lease = store.objects.read_versioned(LEASE_KEY)
        assert lease is not None and json.loads(lease[0])["released"] is False


def test_retention_deletes_behind_after_the_newer_manifest_and_before_the_release(
        s3_env: Any, tmp_path: Path) -> None:
    store, rec = _store(s3_env, tmp_path)
    published: dict[int, float] = {}
    with store.locked():
        for cid in range(1, 6):
            files, manifest = sample_checkpoint(cid, cid - 1 if cid > 1 else None)
            store.write_checkpoint(cid, files, manifest)
            published[cid] = rec.one(
                "PutObject", f"{checkpoint_dirname(cid)}/MANIFEST.json").end
            for old in store.ids()[:-2]:  # as the engine's retention, keep = 2
                store.delete(old)
                assert old not in store.ids()  # forgotten at once, deleted behind
        assert store.ids() == [4, 5]
    released = [r for r in rec.find("PutObject", LEASE_KEY)][-1]
    for old in (1, 2, 3):
        d = checkpoint_dirname(old)
        marker = rec.one("PutObject", f"{DELETING}{d}")
        mine = [marker, *rec.find("DeleteObject", f"{d}/MANIFEST.json"),
                *rec.find("DeleteObject", f"{d}/.claim"),
                rec.one("DeleteObject", f"{DELETING}{d}")]
        assert len(mine) == 4, mine
        # behind the caller, after the manifest of the checkpoint that made it old
        assert all(r.thread.startswith("sealstream-s3bg") for r in mine), mine
        assert marker.start >= published[old + 2]
        assert all(r.end <= released.start for r in mine), (mine, released)
    assert store.objects.keys(DELETING) == []
    reader, _ = _store(s3_env, tmp_path)
    assert reader.ids() == [4, 5]
    lease = store.objects.read_versioned(LEASE_KEY)
    assert lease is not None and json.loads(lease[0])["released"] is True
