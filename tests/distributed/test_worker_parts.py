"""Each worker writes its own part of a checkpoint into the job's store (a directory
or PostgreSQL); the coordinator only signs and publishes the manifest, last.

A coordinator SIGKILLed after the parts were written and before the manifest was
published leaves a partial checkpoint that recovery judges like any crashed
writer's (NO_MANIFEST, moved aside); the output stays exact.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest
from test_scale_out import STORY, WINDOWS, _job, _story_spec

from scenarios._story import assert_same_output as assert_same_dirs


def _no_coordinator_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail if the parts' bytes were ever taken by the coordinator."""
    from sealstream.distributed._shard import ShardedOperator

    def refuse(self: Any) -> list[bytes]:
        raise AssertionError("the coordinator took the parts' bytes")

    monkeypatch.setattr(ShardedOperator, "take_parts", refuse)


def test_parts_written_by_the_workers_verify(
        ray_cluster: Any, tmp_path: Path, reference: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from sealstream.cli import main

    _no_coordinator_path(monkeypatch)
    ref = reference(window=WINDOWS["tumbling"], **STORY)
    d = tmp_path / "dist"
    spec = _story_spec(d, "tumbling")
    job = _job(spec, 2)
    job.run()
    assert_same_dirs(d, ref)
    kept = sorted((d / "ckpt").glob("cp-*"))
    assert kept
    for cp in kept:
        assert sorted(p.name for p in cp.glob("state.part-*")) == [
            "state.part-0000.arrow", "state.part-0001.arrow"]
        doc = json.loads((cp / "MANIFEST.json").read_text())
        assert {"part:0", "part:1"} <= set(doc["files"])
    assert main(["checkpoints", "verify", str(d / "ckpt")]) == 0


def test_coordinator_killed_between_the_parts_and_the_manifest(
        ray_cluster: Any, tmp_path: Path, reference: Any) -> None:
    """``run --workers 2`` SIGKILLs itself once every worker wrote its part of the
    second checkpoint (crash point ``after_write_parts``), before the manifest: the
    parts are there, no manifest; the next run moves that checkpoint aside as
    NO_MANIFEST, resumes from the first and gives the exact output."""
    ref = reference(window=WINDOWS["session"], **STORY)
    d = tmp_path / "dist"
    spec = _story_spec(d, "session")
    env = dict(os.environ, SEALSTREAM_CRASH_AT="after_write_parts:2")
    proc = subprocess.run(
        [sys.executable, "-m", "sealstream", "run", str(spec), "--quiet", "--workers", "2",
         "--ray", ray_cluster.address],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    partial = sorted((d / "ckpt").glob("cp-*"))[-1]
    assert not (partial / "MANIFEST.json").exists()
    assert sorted(p.name for p in partial.glob("state.part-*")) == [
        "state.part-0000.arrow", "state.part-0001.arrow"]
    job = _job(spec, 2)
    job.run()
    cid = int(partial.name[3:])
    assert [(r["id"], r["reason"]) for r in job.rejected] == [(cid, "NO_MANIFEST")]
    assert job.resumed_from == cid - 1
    assert not partial.exists() and list((d / "ckpt" / "rejected").glob(f"{partial.name}-*"))
    assert_same_dirs(d, ref)


def test_postgres_store_with_workers(
        ray_cluster: Any, tmp_path: Path, reference: Any, pg_url: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Checkpoints in PostgreSQL, parts written by the workers: 2 workers stop after a
    checkpoint, 3 workers resume to the end; the output is exact and every kept
    checkpoint holds one part per worker of the run that wrote it."""
    _no_coordinator_path(monkeypatch)
    ref = reference(window=WINDOWS["sliding"], **STORY)
    d = tmp_path / "dist"
    spec = _story_spec(d, "sliding")
    spec.write_text(spec.read_text().replace('path = "ckpt"', f"url = {json.dumps(pg_url)}"))
    first = _job(spec, 2, stop_when=lambda j: True)
    first.run()
    assert first.stopped_early
    job = _job(spec, 3)
    job.run()
    assert job.resumed_from is not None
    assert_same_dirs(d, ref)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT id, count(*) FILTER (WHERE name LIKE '%%/state.part-%%'), "
            "bool_or(name LIKE '%%/MANIFEST.json') FROM sealstream_checkpoint_files "
            "WHERE pipeline = 'story' GROUP BY id ORDER BY id").fetchall()
    assert rows and all(published for _, _, published in rows)
    assert rows[0][1] in (2, 3) and rows[-1][1] == 3
    from sealstream.cli import main

    assert main(["checkpoints", "verify", pg_url, "--pipeline", "story"]) == 0


def test_sqlite_store_parts_go_through_the_coordinator(
        ray_cluster: Any, tmp_path: Path, reference: Any) -> None:
    """An SQLite store has no direct parts (its lock is a kernel lock of the
    coordinator's process on one host's file): the coordinator writes them; the
    output is exact and the checkpoints verify."""
    from sealstream.checkpoint.stores.sqlite import SqliteCheckpointStore
    from sealstream.cli import main

    ref = reference(window=WINDOWS["tumbling"], **STORY)
    d = tmp_path / "dist"
    spec = _story_spec(d, "tumbling")
    spec.write_text(spec.read_text().replace('path = "ckpt"', 'url = "sqlite:///ck.db"'))
    _job(spec, 2).run()
    assert_same_dirs(d, ref)
    store = SqliteCheckpointStore(d / "ck.db", "story", encryption_key=None)
    try:
        newest = store.ids()[-1]
        assert sum(".part-" in n for n in store._names(newest)) == 2
    finally:
        store.close()
    assert main(["checkpoints", "verify", f"sqlite:///{d / 'ck.db'}",
                 "--pipeline", "story"]) == 0
