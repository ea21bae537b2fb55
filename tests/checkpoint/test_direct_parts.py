"""Parts written into a claimed checkpoint by other processes (scale-out workers):
directory and PostgreSQL stores. Create-if-absent, durable, fenced by the
coordinator's lock: a worker of a job that lost its lock adds nothing, least of all
to a checkpoint of the new holder. The manifest, published last by the
coordinator, binds the parts; the guard judges the whole."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import polars as pl
import psycopg
import pytest

from sealstream.checkpoint import crypto, guard
from sealstream.checkpoint.manifest import part_name, seal
from sealstream.checkpoint.stores import CheckpointStore, LocalCheckpointStore, checkpoint_dirname
from sealstream.checkpoint.stores.postgres import PostgresCheckpointStore
from sealstream.checkpoint.stores.sqlite import SqliteCheckpointStore
from sealstream.errors import CheckpointError, LockHeldError
from sealstream.state.codec import WATERMARK_META, encode_table, sha256_hex
from sealstream.testing.store_contract import PIPELINE, SIGNING_KEY, sample_checkpoint

POLICY = guard.Policy(key=SIGNING_KEY, pipeline=PIPELINE)


def _part(i: int, cid: int) -> bytes:
    wm = {"global_ms": cid}
    return encode_table(pl.DataFrame({"key": [f"k{i}"], "n": [i]}),
                        {WATERMARK_META.decode(): wm})


def _publish(store: CheckpointStore, cid: int, parts: dict[int, bytes]) -> None:
    """What the coordinator does after the workers wrote ``parts``: the small files,
    then the signed manifest naming every part with its SHA-256, published last."""
    files, manifest = sample_checkpoint(cid)
    body = json.loads(manifest)
    d = checkpoint_dirname(cid)
    for i, data in parts.items():
        body["files"][f"part:{i}"] = {"path": f"{d}/{part_name(i)}",
                                      "sha256": sha256_hex(data), "bytes": len(data)}
    body.pop("signature")
    store.write_checkpoint(cid, files, seal(body, SIGNING_KEY), claimed=True)


def _verdict(store: CheckpointStore, cid: int) -> guard.Verdict:
    return guard.judge(store.evidence(cid, SIGNING_KEY), None, POLICY)


def _other_holder(lock: Path) -> subprocess.Popen[str]:
    """Another process holding the directory's lock until its stdin closes."""
    code = ("import sys; from pathlib import Path\n"
            "from sealstream.checkpoint.stores import LocalCheckpointStore\n"
            f"s = LocalCheckpointStore(Path({str(lock)!r}), encryption_key=None)\n"
            "with s.locked():\n    print('held', flush=True); sys.stdin.read()\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


@pytest.mark.parametrize("encrypted", [False, True])
def test_directory_parts_written_by_workers_verify(tmp_path: Path, encrypted: bool) -> None:
    key = bytes(range(32)) if encrypted else None
    store = LocalCheckpointStore(tmp_path / "ck", encryption_key=key)
    with store.locked():
        store.claim(1)
        fence = store.fence()
        assert isinstance(fence, str) and '"pid"' in fence
        worker = LocalCheckpointStore(tmp_path / "ck", encryption_key=key)  # another process
        parts = {i: _part(i, 1) for i in range(2)}
        for i, data in parts.items():
            worker.write_part(1, part_name(i), data, fence)
        with pytest.raises(CheckpointError, match="File exists"):
            worker.write_part(1, part_name(0), parts[0], fence)  # create-if-absent
        with pytest.raises(CheckpointError, match="not being written"):
            worker.write_part(2, part_name(0), parts[0], fence)  # never claimed
        with pytest.raises(CheckpointError, match="not a state part"):
            worker.write_part(1, "MANIFEST.json", b"{}", fence)
        _publish(store, 1, parts)
        with pytest.raises(CheckpointError, match="already published"):
            worker.write_part(1, part_name(2), _part(2, 1), fence)
        assert _verdict(store, 1).ok
        if encrypted:  # sealed with the key, bound to its name
            raw = (tmp_path / "ck" / checkpoint_dirname(1) / part_name(0)).read_bytes()
            assert crypto.is_envelope(raw)


def test_directory_part_of_a_fenced_run_is_refused(tmp_path: Path) -> None:
    """The run that claimed checkpoint 1 ends; another process takes the lock: the old
    run's worker writes nothing, and a partial checkpoint it wrote to before is judged
    NO_MANIFEST (moved aside by recovery: ids are never reused)."""
    root = tmp_path / "ck"
    store = LocalCheckpointStore(root, encryption_key=None)
    with store.locked():
        store.claim(1)
        fence = store.fence()
        store.write_part(1, part_name(0), _part(0, 1), fence)
    other = _other_holder(root)
    try:
        with pytest.raises(LockHeldError, match="no longer holds the lock"):
            store.write_part(1, part_name(1), _part(1, 1), fence)
        assert sorted(p.name for p in (root / checkpoint_dirname(1)).iterdir()) == [
            part_name(0)]
        v = _verdict(store, 1)
        assert not v.ok and v.reason == "NO_MANIFEST"
        assert store.max_id_ever() == 1
        store.move_aside(1, v.reason)
        assert store.max_id_ever() == 1  # the new holder's next checkpoint is 2
    finally:
        other.communicate(timeout=60)  # closes its stdin: it lets the lock go


def test_sqlite_has_no_direct_parts(tmp_path: Path) -> None:
    store = SqliteCheckpointStore(tmp_path / "ck.db", PIPELINE, encryption_key=None)
    assert not store.direct_parts
    with pytest.raises(NotImplementedError):
        store.claim(1)
    store.close()


def _sql(url: str, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(url, autocommit=True) as conn:
        cur = conn.execute(sql, args)
        return cur.fetchall() if cur.description else []


def test_postgres_parts_written_by_workers_verify_and_are_fenced(pg_url: str) -> None:
    store = PostgresCheckpointStore(pg_url, PIPELINE, encryption_key=None)
    worker = PostgresCheckpointStore(pg_url, PIPELINE, encryption_key=None)
    try:
        with pytest.raises(LockHeldError, match="its database session ended"), store.locked():
            store.claim(1)
            fence = store.fence()
            assert isinstance(fence, list) and len(fence) == 2
            parts = {i: _part(i, 1) for i in range(3)}
            for i, data in parts.items():
                worker.write_part(1, part_name(i), data, fence)
            with pytest.raises(CheckpointError, match="already exists"):
                worker.write_part(1, part_name(0), parts[0], fence)
            with pytest.raises(CheckpointError, match="not being written"):
                worker.write_part(2, part_name(0), parts[0], fence)
            _publish(store, 1, parts)
            with pytest.raises(CheckpointError, match="already published"):
                worker.write_part(1, part_name(3), _part(3, 1), fence)
            assert _verdict(store, 1).ok
            store.claim(2)
            worker.write_part(2, part_name(0), _part(0, 2), fence)
            # the lock's session ends (a network cut, a terminated backend)
            (pid,), = _sql(pg_url, "SELECT backend_pid FROM sealstream_lock_holders "
                                   "WHERE pipeline = %s", PIPELINE)
            _sql(pg_url, "SELECT pg_terminate_backend(%s)", pid)
            while _sql(pg_url, "SELECT count(*) FROM pg_stat_activity WHERE pid = %s",
                       pid) != [(0,)]:
                time.sleep(0.02)  # waiting for the session's end, an event
            with pytest.raises(LockHeldError, match="its database session ended"):
                worker.write_part(2, part_name(1), _part(1, 2), fence)
            new = PostgresCheckpointStore(pg_url, PIPELINE, encryption_key=None)
            with new.locked():  # a new holder: a new generation, ids above every id used
                nxt = new.max_id_ever() + 1
                assert nxt == 3
                new.claim(nxt)
                for cid in (2, nxt):
                    with pytest.raises(LockHeldError, match="another run took it"):
                        worker.write_part(cid, part_name(1), _part(1, cid), fence)
                assert new._names(nxt) == []
                v = _verdict(new, 2)
                assert not v.ok and v.reason == "NO_MANIFEST"
                worker.write_part(nxt, part_name(0), _part(0, nxt), new.fence())
                assert new._names(nxt) == [f"{checkpoint_dirname(nxt)}/{part_name(0)}"]
            new.close()
    finally:
        store.close()
        worker.close()
