"""Agent checkpoints in S3 (``s3://bucket/prefix``, a real SeaweedFS server).

The row store contract and the tamper stories that run on SQLite and PostgreSQL run
here unchanged on :class:`~sealstream.agents._s3store.S3RowStore` (imported below:
pytest runs them with this module's ``backend_url``). Then what is S3's own: a
second writer process is refused in one line; a SIGKILLed writer's lease is taken
over; a writer SIGKILLed before, at and after the commit point (the journal written,
the lease naming it, half its rows applied) leaves each transaction absent or whole;
a reader without the lease sees whole transactions; rows, the journal and the lease
altered in the bucket behind the store's back are judged or refused in one line."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from typing import Any

import pytest
import test_agent_store_contract as contract
from test_agent_store_contract import (  # noqa: F401 - run here on S3
    test_a_statement_failing_late_rolls_back_everything,
    test_agent_checkpoint_round_trip_history_retention,
    test_none_verifies_is_an_explicit_error,
    test_row_store_contract,
)

from sealstream.agents import AgentCheckpoint, AgentCheckpointStore, open_row_store
from sealstream.agents._s3store import S3RowStore, row_key
from sealstream.errors import CheckpointError

KEY = b"s3-agent-signing-key"


@pytest.fixture
def s3_env(s3_server: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)
    return s3_server


@pytest.fixture
def backend_url(s3_env: Any) -> str:
    """A fresh agent store: a new prefix in the test server's bucket."""
    return f"s3://{s3_env.bucket}/agents-{uuid.uuid4().hex[:12]}"


def _objects(url: str, server: Any) -> Any:
    import boto3

    from sealstream._objects.s3 import S3Objects

    bucket, prefix = url.removeprefix("s3://").split("/", 1)
    client = boto3.client("s3", endpoint_url=server.endpoint, region_name="us-east-1",
                          aws_access_key_id=server.access_key,
                          aws_secret_access_key=server.secret_key)
    return S3Objects(bucket, prefix, server.endpoint, client=client)


CHILD = """
import sys
from sealstream._runtime.crash import CrashPoints
from sealstream.agents import AgentCheckpoint, AgentCheckpointStore
url, start, stop, crash = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
store = AgentCheckpointStore(url, key=b"s3-agent-signing-key", encryption_key=None)
for i in range(start, stop):
    if i == stop - 1 and crash:
        store.rows.crash = CrashPoints(crash)
    store.save(AgentCheckpoint("e", node=f"n{i}", state={"i": i}))
    print("saved", i, flush=True)
store.close()
"""


def _child(url: str, start: int, stop: int, crash: str = "",
           env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", CHILD, url, str(start), str(stop), crash],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, **(env or {})})


def _saved(url: str, start: int, stop: int) -> None:
    """What CHILD does without a crash point, in this process (a writer that is not
    killed needs no process of its own: the lease is per process either way)."""
    store = AgentCheckpointStore(url, key=KEY, encryption_key=None)
    for i in range(start, stop):
        store.save(AgentCheckpoint("e", node=f"n{i}", state={"i": i}))
    store.close()


# The contract's sizes but its largest: 250 is there for SQLite's statements of 200
# and PostgreSQL's key ranges; S3 looks every row up by its key on the same thread
# pool whatever the count (40 already spans several rounds of its 8 threads), and
# writing 250's 2,500 rows one PUT at a time cost 40-60 s.
@pytest.mark.parametrize("count", [1, 5, 17, 40])
def test_fetch_returns_exactly_what_was_asked(backend_url: str, count: int) -> None:
    contract.test_fetch_returns_exactly_what_was_asked(backend_url, count)


def _states(url: str) -> list[int]:
    store = AgentCheckpointStore(url, key=KEY, encryption_key=None)
    try:
        history = store.history("e")
        assert all(v.ok for v in history), history
        return [store.load("e", v.checkpoint_id).state["i"] for v in reversed(history)]
    finally:
        store.close()


def test_unknown_urls_still_name_s3_among_the_choices() -> None:
    with pytest.raises(CheckpointError, match="s3://BUCKET/PREFIX"):
        open_row_store("mysql://u:secret@host/db")


@pytest.mark.parametrize(("point", "whole"), [
    ("s3_rows_journal_written", False),  # before the commit point: absent
    ("s3_rows_committed", True),         # the lease names the journal: redone
    ("s3_rows_row_applied:2", True),     # half its rows applied: redone
])
def test_sigkill_mid_commit_leaves_the_transaction_absent_or_whole(
        backend_url: str, s3_env: Any, point: str, whole: bool) -> None:
    _saved(backend_url, 0, 3)
    crashed = _child(backend_url, 3, 4, crash=point)
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    objects = _objects(backend_url, s3_env)
    assert objects.keys("journal/"), "the crash left no journal to redo or drop"
    # a reader in another process (no lease) sees whole transactions only
    reader = S3RowStore(backend_url)
    with reader.reading() as tx:
        names = [k[0] for k in tx.keys("cp", "e", "")]
    assert len(names) == (4 if whole else 3)
    assert _states(backend_url) == ([0, 1, 2, 3] if whole else [0, 1, 2])
    assert objects.keys("journal/") == []  # redone (or dropped) by the next writer
    _saved(backend_url, 4, 6)  # and the history goes on
    assert _states(backend_url) == ([0, 1, 2, 3, 4, 5] if whole else [0, 1, 2, 4, 5])
    reader.close()


def test_a_second_writer_process_is_refused_in_one_line(backend_url: str,
                                                        s3_env: Any) -> None:
    store = AgentCheckpointStore(backend_url, key=KEY, encryption_key=None)
    store.save(AgentCheckpoint("e", node="n0", state={"i": 0}))
    second = _child(backend_url, 1, 2)
    assert second.returncode == 1, second.stderr
    last = second.stderr.strip().splitlines()[-1]
    assert "is locked by another process" in last and f'"pid": {os.getpid()}' in last
    assert s3_env.secret_key not in second.stderr
    store.close()  # releases the lease: the next process writes
    again = _child(backend_url, 1, 2)
    assert again.returncode == 0, again.stderr
    assert _states(backend_url) == [0, 1]


def test_a_fenced_writer_commits_nothing(backend_url: str, s3_env: Any) -> None:
    store = AgentCheckpointStore(backend_url, key=KEY, encryption_key=None)
    store.save(AgentCheckpoint("e", node="n0", state={"i": 0}))
    objects = _objects(backend_url, s3_env)
    doc, etag = objects.read_versioned("LEASE")
    lease = json.loads(doc)
    lease.update(holder={"pid": 1, "host": "elsewhere", "run": "other"},
                 generation=lease["generation"] + 1)
    objects.replace("LEASE", json.dumps(lease).encode(), etag)  # taken over
    from sealstream.errors import LockHeldError

    with pytest.raises(LockHeldError, match="lost the lease"):
        store.save(AgentCheckpoint("e", node="n1", state={"i": 1}))
    reader = S3RowStore(backend_url)
    with reader.reading() as tx:
        assert len(tx.keys("cp", "e", "")) == 1
    reader.close()
    store.close()


def test_rows_altered_in_the_bucket_are_judged(backend_url: str, s3_env: Any) -> None:
    store = AgentCheckpointStore(backend_url, key=KEY, encryption_key=None)
    store.save(AgentCheckpoint("e", node="n0", state={"i": 0}))
    second = store.save(AgentCheckpoint("e", node="n1", state={"i": 1}))
    store.close()
    objects = _objects(backend_url, s3_env)
    obj = row_key(("cp", "e", "", second.checkpoint_id))
    data = objects.get(obj)
    assert data is not None
    objects.delete(obj)  # behind the store's back, straight in the bucket
    doc = json.loads(data)
    doc["tampered"] = True
    objects.create(obj, json.dumps(doc).encode())
    reopened = AgentCheckpointStore(backend_url, key=KEY, encryption_key=None)
    assert [(v.verdict, v.reason) for v in reopened.history("e")] == [
        ("INCONSISTENT_STATE", "SIGNATURE_MISMATCH"), ("ATOMIC_CHECKPOINT", "OK")]
    latest = reopened.latest("e", fallback="verified")
    assert latest is not None and latest.state == {"i": 0}
    objects.delete(obj)
    objects.create(obj, data[: len(data) // 2])
    assert reopened.history("e")[0].reason == "MANIFEST_UNREADABLE"
    reopened.close()


def test_a_damaged_journal_or_lease_is_refused_in_one_line(backend_url: str,
                                                           s3_env: Any) -> None:
    _saved(backend_url, 0, 1)
    crashed = _child(backend_url, 1, 2, crash="s3_rows_committed")
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    objects = _objects(backend_url, s3_env)
    (journal,) = objects.keys("journal/")
    body = objects.get(journal)
    objects.delete(journal)
    objects.create(journal, body[:-7])
    resumed = _child(backend_url, 2, 3)
    assert resumed.returncode == 1
    line = resumed.stderr.strip().splitlines()[-1]
    assert f"{journal} is not a journal" in line and "refusing the store" in line
    objects.delete(journal)
    objects.create(journal, body)  # put back: the redo completes the transaction
    doc, etag = objects.read_versioned("LEASE")
    objects.replace("LEASE", b"not a lease", etag)
    refused = _child(backend_url, 2, 3)
    assert refused.returncode == 1
    assert "LEASE is not a lease" in refused.stderr.strip().splitlines()[-1]
    objects.replace("LEASE", doc, objects.read_versioned("LEASE")[1])
    assert _states(backend_url) == [0, 1]


def test_writes_of_one_transaction_combine_as_in_sql(tmp_path: Any) -> None:
    """Create-if-absent after a replace or a creation leaves the row; after a deletion
    it creates it; ``add`` (outcome not needed) keeps a row already stored. On local
    objects: the protocol is the same on any Objects."""
    from sealstream._objects import LocalObjects

    rows = S3RowStore("local", objects=LocalObjects(tmp_path / "objects"))
    with rows.transaction() as tx:
        tx.insert("s", "e", "", "stored", b"old")
        tx.insert("s", "e", "", "gone", b"old")
    with rows.transaction() as tx:
        tx.upsert("s", "e", "", "replaced", b"put")
        tx.add("s", "e", "", "replaced", b"added")
        tx.add("s", "e", "", "twice", b"first")
        tx.add("s", "e", "", "twice", b"second")
        tx.add("s", "e", "", "stored", b"added")
        assert tx.get("s", "e", "", "stored") == b"old"
        assert tx.delete("s", "e", "", ["gone"]) == 1
        assert tx.insert("s", "e", "", "gone", b"new")
        assert not tx.insert("s", "e", "", "twice", b"third")
    assert {r.name: r.data for r in rows.scan("s", "e", "")} == {
        "gone": b"new", "replaced": b"put", "stored": b"old", "twice": b"first"}
    rows.close()


def test_a_reader_without_the_lease_sees_committed_unapplied_writes(tmp_path: Any) -> None:
    """A writer killed after its commit point (here: its rows never applied) leaves a
    journal that ``LEASE`` names; a reader that does not take the lease lays it over
    the rows."""
    from sealstream._objects import LocalObjects

    objects = LocalObjects(tmp_path / "objects")
    writer = S3RowStore("local", objects=objects)
    with writer.transaction() as tx:
        tx.insert("s", "e", "", "a", b"1")
    writer._apply = lambda journal, ops: None  # type: ignore[method-assign] # "killed"
    with writer.transaction() as tx:
        tx.upsert("s", "e", "", "a", b"2")
        tx.insert("s", "e", "", "b", b"3")
    assert objects.keys("journal/") and objects.get(row_key(("s", "e", "", "a"))) == b"1"
    from sealstream.agents import _s3store

    reader = S3RowStore("local", objects=objects)
    reader._lease = _s3store._Lease()  # as another process would: not the holder
    with reader.reading() as tx:
        assert {r.name: r.data for r in tx.scan("s", "e", "")} == {"a": b"2", "b": b"3"}
        assert [k[0] for k in tx.keys("s", "e", "")] == ["b", "a"]
