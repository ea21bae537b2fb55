"""Story: PostgreSQL faults under a running job, with a real server.

* The job's lock session is ended (``pg_terminate_backend``) while the job runs and
  a second run starts beside it: the first run stops with exit 1 ("the lock ... was
  lost") and commits nothing more; the second run finishes; every result, late
  event and bad record is committed exactly once.
* The store's data connection is ended between two checkpoints: the job reconnects
  and goes on, exactly once.
* An unreachable server: exit 1 after the bounded retry time, the server named.

No timer races the job: the test holds a row the job needs for its second
checkpoint (an uncommitted insert of checkpoint id 2), waits until the job is seen
waiting for it, does its damage, and only then lets the job go on.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest
from _story import assert_same_output, make_input, run, uninterrupted, write_spec

from sealstream.checkpoint.stores import redact
from sealstream.checkpoint.stores.postgres import PostgresCheckpointStore, lock_key

STORY = {"errors": True, "bad_every": 97}
expected = uninterrupted(**STORY)


def _spec(d: Path, url: str, table: bool = False) -> Path:
    """The story with its checkpoints in ``url``; ``table``: its results in a table of
    the same database (they commit in the transaction that publishes a checkpoint)."""
    spec = write_spec(d, make_input(d, bad_every=97), errors=True)
    text = spec.read_text().replace('path = "ckpt"', f"url = {json.dumps(url)}")
    if table:
        text = text.replace('[sink]\nkind = "jsonl"\npath = "out"',
                            f'[sink]\nkind = "postgresql"\nurl = {json.dumps(url)}\n'
                            'table = "story_results"')
    spec.write_text(text)
    return spec


def _start(spec: Path, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    e = {k: v for k, v in os.environ.items() if k != "SEALSTREAM_CRASH_AT"}
    e.update(env or {})
    return subprocess.Popen([sys.executable, "-m", "sealstream", "run", str(spec), "--quiet"],
                            env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _until(cond: Callable[[], bool], what: str, *procs: subprocess.Popen[str]) -> None:
    """Wait for a state of the server (not for time to pass): the bound only turns a
    hang into a failure."""
    deadline = time.monotonic() + 120
    while not cond():
        for p in procs:
            if p.poll() is not None:
                out, err = p.communicate()
                pytest.fail(f"a run ended ({p.returncode}) before {what}: {err}")
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.02)


def _one(conn: Any, sql: str, *args: object) -> Any:
    row = conn.execute(sql, args).fetchone()
    return None if row is None else row[0]


def _waiting(admin: Any) -> int:
    """Sessions of this database waiting for a lock (a row held by the test)."""
    return int(_one(admin, "SELECT count(*) FROM pg_stat_activity WHERE datname = "
                           "current_database() AND wait_event_type = 'Lock'"))


def _lock_session(admin: Any, pipeline: str = "story") -> int | None:
    key = lock_key(pipeline)
    pid = _one(admin, "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted "
                      "AND classid::bigint = %s AND objid::bigint = %s AND objsubid = 1 "
                      "AND database = (SELECT oid FROM pg_database "
                      "WHERE datname = current_database())",
               (key >> 32) & 0xFFFFFFFF, key & 0xFFFFFFFF)
    return None if pid is None else int(pid)


def _end_session(admin: Any, pid: int) -> None:
    assert _one(admin, "SELECT pg_terminate_backend(%s)", pid)
    _until(lambda: _one(admin, "SELECT count(*) FROM pg_stat_activity WHERE pid = %s",
                        pid) == 0, f"session {pid} ended")


def _hold_checkpoint_2(url: str) -> Any:
    """An open transaction holding checkpoint id 2 of pipeline story: the job's claim of
    its second checkpoint waits for it."""
    PostgresCheckpointStore(url, "story").ensure_root()
    holder = psycopg.connect(url)
    holder.execute("INSERT INTO sealstream_checkpoints (pipeline, id) VALUES ('story', 2)")
    return holder


@pytest.mark.parametrize("table", [False, True], ids=["files", "table"])
def test_a_run_that_loses_its_lock_stops_and_the_next_commits_each_result_once(
        tmp_path: Path, expected: Path, pg_url: str, table: bool) -> None:
    spec = _spec(tmp_path, pg_url, table)
    holder = _hold_checkpoint_2(pg_url)
    first = second = None
    with psycopg.connect(pg_url, autocommit=True) as admin:
        try:
            first = _start(spec)
            _until(lambda: _waiting(admin) == 1, "the first run waits to claim checkpoint 2",
                   first)
            pid = _lock_session(admin)
            assert pid is not None
            _end_session(admin, pid)  # the first run's lock is gone; it does not know yet
            second = _start(spec)  # takes the free lock
            _until(lambda: _waiting(admin) == 2, "the second run waits too", first, second)
            holder.rollback()  # both go on
            _, err1 = first.communicate(timeout=120)
            _, err2 = second.communicate(timeout=120)
        finally:
            holder.close()
            for p in (first, second):
                if p is not None and p.poll() is None:
                    p.kill()
                    p.communicate()
    assert first.returncode == 1, err1
    msg = err1.strip().splitlines()[-1]
    assert "lock on the checkpoints of pipeline 'story'" in msg and "was lost" in msg, msg
    assert "Traceback" not in err1
    assert second.returncode == 0, err2
    check = _table_check(tmp_path, pg_url, expected) if table else (
        lambda: assert_same_output(tmp_path, expected))
    check()
    again = run(spec)  # the job is finished: a rerun changes nothing
    assert again.returncode == 0, again.stderr
    check()


def _table_check(d: Path, url: str, expected: Path) -> Callable[[], None]:
    """Each result exactly once in the table, equal to the uninterrupted run's; late
    events and bad records exactly once in their files."""
    from test_db_sinks import assert_files_equal, assert_table_equals

    def check() -> None:
        assert_table_equals(d, "postgresql", url, expected)
        assert_files_equal(d, expected)
    return check


def test_a_lost_lock_is_noticed_without_a_second_run(tmp_path: Path, expected: Path,
                                                     pg_url: str) -> None:
    """The session ends and nobody takes the lock: the run stops at its next commit
    (exit 1), and a rerun resumes and is exact."""
    spec = _spec(tmp_path, pg_url)
    holder = _hold_checkpoint_2(pg_url)
    first = None
    with psycopg.connect(pg_url, autocommit=True) as admin:
        try:
            first = _start(spec)
            _until(lambda: _waiting(admin) == 1, "the run waits to claim checkpoint 2", first)
            pid = _lock_session(admin)
            assert pid is not None
            _end_session(admin, pid)
            holder.rollback()
            _, err = first.communicate(timeout=120)
        finally:
            holder.close()
            if first is not None and first.poll() is None:
                first.kill()
                first.communicate()
    assert first.returncode == 1, err
    assert "was lost" in err and "its database session ended" in err, err
    resumed = run(spec)
    assert resumed.returncode == 0, resumed.stderr
    assert_same_output(tmp_path, expected)


def test_a_lost_data_connection_is_retried(tmp_path: Path, expected: Path,
                                           pg_url: str) -> None:
    """The store's data connection (the one waiting to claim checkpoint 2) is ended:
    the run reconnects, claims it and finishes; the output is exact."""
    spec = _spec(tmp_path, pg_url)
    holder = _hold_checkpoint_2(pg_url)
    job = None
    with psycopg.connect(pg_url, autocommit=True) as admin:
        try:
            job = _start(spec)
            _until(lambda: _waiting(admin) == 1, "the run waits to claim checkpoint 2", job)
            data = _one(admin, "SELECT pid FROM pg_stat_activity WHERE datname = "
                               "current_database() AND wait_event_type = 'Lock'")
            assert data is not None and data != _lock_session(admin)
            _end_session(admin, int(data))
            holder.rollback()
            _, err = job.communicate(timeout=120)
        finally:
            holder.close()
            if job is not None and job.poll() is None:
                job.kill()
                job.communicate()
    assert job.returncode == 0, err
    # the retry is shown, one line when it starts and one when it is over; no driver
    # noise, no traceback
    shown = redact(pg_url)
    lines = err.strip().splitlines()
    assert len(lines) == 2, err
    assert re.fullmatch(rf"sealstream: lost the connection to {re.escape(shown)} \(.+\); "
                        r"reconnecting with back-off for up to 30 s", lines[0]), err
    assert re.fullmatch(rf"sealstream: reconnected to {re.escape(shown)} after "
                        r"\d+\.\d s", lines[1]), err
    assert_same_output(tmp_path, expected)


def test_an_unreachable_server_fails_after_the_retry_time(tmp_path: Path) -> None:
    url = "postgresql://bob:s3cret@127.0.0.1:1/jobs"  # nothing listens on port 1
    spec = _spec(tmp_path, url)
    started = time.monotonic()
    res = run(spec, env={"SEALSTREAM_PG_RETRY_S": "1.5"})
    took = time.monotonic() - started
    assert res.returncode == 1, res.stderr
    lines = res.stderr.strip().splitlines()
    line = lines[-1]
    assert "cannot connect to postgresql://bob:***@127.0.0.1:1/jobs" in line, line
    # the retry was shown while it lasted, once
    assert [x for x in lines if "retrying" in x] == [
        x for x in lines if x.startswith("sealstream: cannot reach postgresql://bob:***@"
                                         "127.0.0.1:1/jobs (")
        and x.endswith("); retrying with back-off for up to 1.5 s")], res.stderr
    assert sum("retrying" in x for x in lines) == 1, res.stderr
    assert "retried for 1.5 s" in line and "s3cret" not in res.stderr, line
    assert took >= 1.5
    bad = run(spec, env={"SEALSTREAM_PG_RETRY_S": "soon"})
    assert bad.returncode == 2 and "SEALSTREAM_PG_RETRY_S: 'soon'" in bad.stderr, bad.stderr


def _stopped(p: subprocess.Popen[str]) -> bool:
    """Whether the process stopped itself (SEALSTREAM_PAUSE_AT: SIGSTOP)."""
    try:
        state = Path(f"/proc/{p.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state == "T"


def test_a_run_whose_staging_the_next_run_cleared_says_it_lost_the_lock(
        tmp_path: Path, expected: Path, pg_url: str) -> None:
    """The first run is stopped after committing its first epoch and its lock session
    ends; a second run takes the lock, resumes and finishes (clearing the first run's
    staging). When the first run goes on, whatever fails first, its one line says the
    lock was lost, and the output is each result once."""
    spec = _spec(tmp_path, pg_url)
    first = None
    try:
        first = _start(spec, env={"SEALSTREAM_PAUSE_AT": "after_commit_results:1"})
        _until(lambda: _stopped(first), "the first run stops after its first commit", first)
        with psycopg.connect(pg_url, autocommit=True) as admin:
            pid = _lock_session(admin)
            assert pid is not None
            _end_session(admin, pid)
        second = run(spec)
        assert second.returncode == 0, second.stderr
        os.kill(first.pid, signal.SIGCONT)
        _, err = first.communicate(timeout=120)
    finally:
        if first is not None and first.poll() is None:
            first.kill()
            first.communicate()
    assert first.returncode == 1, err
    line = err.strip().splitlines()[-1]
    assert "lock on the checkpoints of pipeline 'story'" in line and "was lost" in line, err
    assert "Traceback" not in err
    assert_same_output(tmp_path, expected)


def test_a_frozen_commit_of_the_previous_holder_is_waited_for_and_said(
        tmp_path: Path, expected: Path, pg_url: str) -> None:
    """A run that held the lock before is frozen inside a commit (here: the test holds
    the lock-holder row as such a commit does): the next run says what it waits for,
    then goes on once that commit ends, and its output is exact."""
    spec = _spec(tmp_path, pg_url)
    with PostgresCheckpointStore(pg_url, "story").locked():
        pass  # the lock-holder row exists, as after any run
    holder = psycopg.connect(pg_url)
    holder.execute("SELECT 1 FROM sealstream_lock_holders WHERE pipeline = 'story' "
                   "FOR UPDATE")
    job = None
    lines: list[str] = []
    try:
        job = _start(spec)
        assert job.stderr is not None
        reader = threading.Thread(target=lambda: lines.extend(job.stderr), daemon=True)
        reader.start()
        _until(lambda: any("waiting for a commit" in x for x in lines),
               "the run says it waits for the frozen commit", job)
        assert job.poll() is None  # it waits, it does not give up
        holder.rollback()
        job.wait(timeout=120)
        reader.join(timeout=30)
    finally:
        holder.close()
        if job is not None:
            if job.poll() is None:
                job.kill()
                job.wait()
            for pipe in (job.stdout, job.stderr):
                if pipe is not None:
                    pipe.close()
    assert job.returncode == 0, "".join(lines)
    assert [x for x in lines if x.strip()] == [
        "sealstream: waiting for a commit of the run that held the lock on pipeline 'story' "
        f"before ({lines[0].split('before (', 1)[1].split(') to end', 1)[0]}) to end: its "
        "process may be stopped or frozen; that commit lands or fails before this run "
        "reads the checkpoints\n"], lines
    assert_same_output(tmp_path, expected)
