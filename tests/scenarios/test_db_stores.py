"""Story: checkpoints in a database (`[checkpoint] url = "sqlite:///ckpt.db"` or
`"postgresql://..."`): SIGKILL mid-protocol, resume, the output equals an
uninterrupted run exactly once, and `sealstream checkpoints list|verify|inspect|
prune URL` judge what the run left. Corrupting or deleting the newest
checkpoint's rows gives the guard's verdicts and a fall-back with exact output."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from _story import assert_same_output, in_process, make_input, run, uninterrupted, write_spec

STORY = {"errors": True, "bad_every": 97}


expected = uninterrupted(**STORY)


def _sqlite_story(d: Path, name: str = "story") -> Path:
    spec = write_spec(d, make_input(d, bad_every=97), errors=True)
    text = spec.read_text().replace('path = "ckpt"', 'url = "sqlite:///ckpt.db"')
    spec.write_text(text.replace('name = "story"', f'name = "{name}"'))
    return spec


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return in_process("checkpoints", *args, env=dict(env or {}))


def _db_story(d: Path, db: str, request: pytest.FixtureRequest) -> tuple[Path, str]:
    """The story with its checkpoints in ``db`` (sqlite or postgresql); returns the spec
    and the store's URL."""
    if db == "sqlite":
        return _sqlite_story(d), f"sqlite:///{d / 'ckpt.db'}"
    url = str(request.getfixturevalue("pg_url"))
    spec = write_spec(d, make_input(d, bad_every=97), errors=True)
    spec.write_text(spec.read_text().replace('path = "ckpt"', f"url = {json.dumps(url)}"))
    return spec, url


def _tamper(db: str, url: str, name: str, how: str) -> None:
    """Damage blob ``name`` behind the store's back: flip a byte, truncate, delete."""
    if db == "sqlite":
        conn = sqlite3.connect(url.removeprefix("sqlite:///"))
        q, table = "?", "sealstream_checkpoint_files"
    else:
        import psycopg

        conn = psycopg.connect(url, autocommit=True)  # type: ignore[assignment]
        q, table = "%s", "sealstream_checkpoint_files"
    try:
        (data,) = conn.execute(f"SELECT data FROM {table} WHERE name = {q}", (name,)).fetchone()
        data = bytes(data)
        if how == "delete":
            conn.execute(f"DELETE FROM {table} WHERE name = {q}", (name,))
        elif how == "text":  # a str: SQLite keeps it as TEXT in the BLOB column
            conn.execute(f"UPDATE {table} SET data = {q} WHERE name = {q}", ("garbage", name))
        elif how == "integer":
            conn.execute(f"UPDATE {table} SET data = 42 WHERE name = {q}", (name,))
        else:
            new = data[: len(data) // 2] if how == "truncate" else (
                data[:100] + bytes([data[100] ^ 0x40]) + data[101:])
            conn.execute(f"UPDATE {table} SET data = {q} WHERE name = {q}", (new, name))
        conn.commit()
    finally:
        conn.close()


@pytest.mark.parametrize("db", ["sqlite", "postgresql"])
@pytest.mark.parametrize("point", ["after_retention", "before_manifest_publish",
                                   "after_write_state"])
def test_kill_then_resume_from_a_database(tmp_path: Path, expected: Path, point: str, db: str,
                                          request: pytest.FixtureRequest) -> None:
    spec, url = _db_story(tmp_path, db, request)
    crashed = run(spec, crash_at=f"{point}:3")
    assert crashed.returncode == -9, f"{point} was not reached: {crashed.stderr}"
    assert not (tmp_path / "ckpt").exists()
    resumed = run(spec)
    assert resumed.returncode == 0, resumed.stderr
    assert_same_output(tmp_path, expected)

    listed = _cli("list", url, "--json")
    assert listed.returncode == 0, listed.stderr
    cps = json.loads(listed.stdout)["checkpoints"]
    assert 1 <= len(cps) <= 3 and all(c["complete"] for c in cps)
    assert [c["id"] for c in cps] == sorted(c["id"] for c in cps)
    verified = _cli("verify", url, "--json", "--spec", str(spec))
    assert verified.returncode == 0, verified.stderr
    data = json.loads(verified.stdout)
    assert {c["verdict"] for c in data["checkpoints"]} == {"ATOMIC_CHECKPOINT"}
    assert data["resume_from"] == cps[-1]["id"]
    shown = _cli("inspect", url, "--json")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["id"] == cps[-1]["id"]
    pruned = _cli("prune", url, "--keep", "1", "--json")
    assert pruned.returncode == 0, pruned.stderr
    after = json.loads(_cli("list", url, "--json").stdout)["checkpoints"]
    assert [c["id"] for c in after] == [cps[-1]["id"]]
    assert "sealstream_test@" not in (listed.stdout + verified.stdout + pruned.stdout)


# each damage on one of the two databases (the contract suite does all on both)
@pytest.mark.parametrize("db,blob,how,verdict", [
    ("sqlite", "state.arrow", "flip", "INCONSISTENT_STATE"),
    ("postgresql", "state.arrow", "flip", "INCONSISTENT_STATE"),
    ("sqlite", "state.arrow", "truncate", "PARTIAL_CHECKPOINT_REJECT"),
    ("postgresql", "receipts.json", "delete", "PARTIAL_CHECKPOINT_REJECT"),
    ("sqlite", "MANIFEST.json", "delete", "PARTIAL_CHECKPOINT_REJECT"),
    ("postgresql", "MANIFEST.json", "delete", "PARTIAL_CHECKPOINT_REJECT"),
    # what `UPDATE ... SET data = 'garbage'` leaves: a value that is not a BLOB
    ("sqlite", "MANIFEST.json", "text", "PARTIAL_CHECKPOINT_REJECT"),
    ("sqlite", "state.arrow", "text", "PARTIAL_CHECKPOINT_REJECT"),
    # 42 is read as the bytes "42": a whole JSON document, not a cut one
    ("sqlite", "receipts.json", "integer", "INCONSISTENT_STATE"),
])
def test_corrupt_newest_checkpoint_falls_back(tmp_path: Path, expected: Path, db: str,
                                              blob: str, how: str, verdict: str,
                                              request: pytest.FixtureRequest) -> None:
    spec, url = _db_story(tmp_path, db, request)
    assert run(spec, crash_at="after_retention:3").returncode == -9
    cps = json.loads(_cli("list", url, "--json").stdout)["checkpoints"]
    newest = cps[-1]["id"]
    _tamper(db, url, f"cp-{newest:012d}/{blob}", how)
    verified = _cli("verify", url, "--json")
    assert verified.returncode == 1 and "Traceback" not in verified.stderr, verified.stderr
    listed = _cli("list", url, "--json")
    assert listed.returncode == 0 and "Traceback" not in listed.stderr, listed.stderr
    assert [c["id"] for c in json.loads(listed.stdout)["checkpoints"]][-1] == newest
    data = json.loads(verified.stdout)
    judged = {c["id"]: c["verdict"] for c in data["checkpoints"]}
    assert judged[newest] == verdict
    assert data["resume_from"] == cps[-2]["id"]
    resumed = run(spec)
    assert resumed.returncode == 0, resumed.stderr
    assert_same_output(tmp_path, expected)
    from sealstream.checkpoint.stores import open_store

    store = open_store(url, "story")
    try:  # the damaged checkpoint is kept aside as evidence, with its verdict's reason
        assert newest in [r["id"] for r in store.rejected()]  # type: ignore[attr-defined]
    finally:
        store.close()


def test_a_checkpoint_row_with_a_text_id_is_no_checkpoint(tmp_path: Path,
                                                          expected: Path) -> None:
    """SQLite keeps 'abc' as TEXT in the INTEGER id column: such a row, written by no
    sealstream, is ignored by list, verify and run instead of raising ValueError."""
    spec = _sqlite_story(tmp_path)
    url = f"sqlite:///{tmp_path / 'ckpt.db'}"
    assert run(spec, crash_at="after_retention:3").returncode == -9
    before = json.loads(_cli("list", url, "--json").stdout)["checkpoints"]
    conn = sqlite3.connect(tmp_path / "ckpt.db")
    conn.execute("INSERT INTO sealstream_checkpoints VALUES ('story', 'abc', 'x')")
    conn.commit()
    conn.close()
    for cmd in ("list", "verify"):
        res = _cli(cmd, url, "--json")
        assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
        assert [c["id"] for c in json.loads(res.stdout)["checkpoints"]] == \
            [c["id"] for c in before]
    resumed = run(spec)
    assert resumed.returncode == 0, resumed.stderr
    assert_same_output(tmp_path, expected)


@pytest.mark.parametrize("db", ["sqlite", "postgresql"])
def test_a_database_without_checkpoints_reads_as_an_empty_store(
        tmp_path: Path, db: str, request: pytest.FixtureRequest) -> None:
    """A database that exists but holds no checkpoints is an empty store, as an empty
    directory is: list and verify print no checkpoints and exit 0 (semantics section 8:
    "or there are none"), prune keeps nothing; only inspect, which needs one, exits 2."""
    if db == "sqlite":
        sqlite3.connect(tmp_path / "empty.db").close()  # a database file, no tables
        url = f"sqlite:///{tmp_path / 'empty.db'}"
    else:
        url = str(request.getfixturevalue("pg_url"))
    listed = _cli("list", url, "--json")
    assert listed.returncode == 0, listed.stderr
    assert json.loads(listed.stdout)["checkpoints"] == []
    verified = _cli("verify", url, "--json")
    assert verified.returncode == 0, verified.stderr
    data = json.loads(verified.stdout)
    assert data["checkpoints"] == [] and data["resume_from"] is None
    pruned = _cli("prune", url, "--keep", "1", "--json")
    assert pruned.returncode == 0, pruned.stderr
    assert json.loads(pruned.stdout)["kept"] == []
    shown = _cli("inspect", url, "--json")
    assert shown.returncode == 2 and "no checkpoints in" in shown.stderr, shown.stderr
    assert "Traceback" not in listed.stderr + verified.stderr + pruned.stderr + shown.stderr


def test_pipelines_share_a_database_and_cli_errors(tmp_path: Path) -> None:
    spec = _sqlite_story(tmp_path)
    assert run(spec).returncode == 0
    # a second pipeline shares the database: its checkpoints are its own
    other = tmp_path / "other"
    other.mkdir()
    spec2 = _sqlite_story(other, name="other")
    spec2.write_text(spec2.read_text().replace('"sqlite:///ckpt.db"',
                                               json.dumps(f"sqlite:///{tmp_path / 'ckpt.db'}")))
    assert run(spec2).returncode == 0
    url = f"sqlite:///{tmp_path / 'ckpt.db'}"
    both = _cli("list", url, "--json")
    assert both.returncode == 2 and "--pipeline" in both.stderr
    for name in ("story", "other"):
        res = _cli("list", url, "--json", "--pipeline", name)
        assert res.returncode == 0, res.stderr
        assert json.loads(res.stdout)["checkpoints"]
    missing = _cli("verify", f"sqlite:///{tmp_path / 'nope.db'}")
    assert missing.returncode == 2 and "does not exist" in missing.stderr
    pg = _cli("list", "postgresql://bob:s3cret@localhost/db")
    assert pg.returncode == 1 and "cannot connect to postgresql://bob:***@localhost/db" in pg.stderr
    assert "s3cret" not in pg.stderr + pg.stdout


def test_replay_from_a_sqlite_checkpoint(tmp_path: Path) -> None:
    """replay reads the live database (read-only) and refuses a destination holding it."""
    spec = _sqlite_story(tmp_path)
    assert run(spec, crash_at="after_retention:3").returncode == -9
    db = f"sqlite:///{tmp_path / 'ckpt.db'}"
    before = _cli("verify", db, "--json").stdout
    res = subprocess.run(
        [sys.executable, "-m", "sealstream", "replay", str(spec), "--from", "2",
         "--to", str(tmp_path / "replay"), "--json", "--quiet"],
        capture_output=True, text=True,
    )
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["replay"]["from"] == "checkpoint 2"
    # the live checkpoints are untouched (SQLite may fold its WAL into the file on close,
    # so compare what the store holds rather than bytes)
    assert _cli("verify", db, "--json").stdout == before
    refused = subprocess.run(
        [sys.executable, "-m", "sealstream", "replay", str(spec), "--from", "2",
         "--to", str(tmp_path)], capture_output=True, text=True,
    )
    assert refused.returncode == 2 and "live" in refused.stderr


def test_passwords_never_appear_in_output(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """A run, its JSON summary, progress log lines and every checkpoints command show the
    database URL with the password hidden."""
    spec, url = _db_story(tmp_path, "postgresql", request)
    assert ":sealstream_test@" in url  # the test server's URL carries a password
    text = spec.read_text().replace('[sink]\nkind = "jsonl"\npath = "out"',
                                    f'[sink]\nkind = "postgresql"\nurl = {json.dumps(url)}\n'
                                    'table = "results"')
    spec.write_text(text)
    res = subprocess.run([sys.executable, "-m", "sealstream", "run", str(spec), "--json",
                          "--summary-json", str(tmp_path / "s.json")],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    seen = res.stdout + res.stderr + (tmp_path / "s.json").read_text()
    ids = [str(c["id"]) for c in json.loads(_cli("list", url, "--json").stdout)["checkpoints"]]
    for args in (["list", url], ["verify", url, "--json"], ["inspect", url],
                 ["diff", url, *ids[-2:]], ["prune", url, "--keep", "2", "--dry-run"]):
        out = _cli(*args)
        assert out.returncode == 0, (args, out.stderr)
        seen += out.stdout + out.stderr
    bad = url.replace("127.0.0.1", "127.0.0.1:1").replace(":5432", "")
    spec.write_text(text.replace(url, bad))
    failed = subprocess.run([sys.executable, "-m", "sealstream", "run",
                             str(spec), "--quiet"], capture_output=True, text=True, timeout=120,
                            env={**os.environ, "PGCONNECT_TIMEOUT": "2",
                                 "SEALSTREAM_PG_RETRY_S": "0.5"})
    assert failed.returncode == 1 and "cannot connect" in failed.stderr
    seen += failed.stdout + failed.stderr + _cli("list", bad,
                                                 env={"SEALSTREAM_PG_RETRY_S": "0.5"}).stderr
    assert ":sealstream_test@" not in seen and "***@" in seen
