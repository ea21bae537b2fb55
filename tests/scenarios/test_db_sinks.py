"""Story: results upserted into a SQLite or PostgreSQL table, with the checkpoints in
the same database (one transaction publishes both) or elsewhere (idempotent
upserts). A real subprocess is SIGKILLed at protocol steps - notably right after
the database commit that publishes the checkpoint and its results - and at random
instants; the table then holds every result exactly once, equal to an
uninterrupted run's JSONL output. Late events and bad records stay in files."""

from __future__ import annotations

import json
import math
import random
import sqlite3
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from _story import (
    assert_same_output,
    committed,
    in_process,
    make_input,
    run,
    run_here,
    run_killed_randomly,
    uninterrupted,
    write_spec,
)

STORY = {"errors": True, "bad_every": 97}
AGGS = ("n", "total", "low", "high", "avg", "first_i", "last_amount")


expected = uninterrupted(**STORY)


def _spec(d: Path, sink: str, store: str, pg_url: str | None) -> Path:
    spec = write_spec(d, make_input(d, bad_every=97), errors=True)
    text = spec.read_text()
    if sink == "sqlite":
        text = text.replace('[sink]\nkind = "jsonl"\npath = "out"',
                            '[sink]\nkind = "sqlite"\nurl = "sqlite:///results.db"\n'
                            'table = "story_results"')
    else:
        text = text.replace('[sink]\nkind = "jsonl"\npath = "out"',
                            f'[sink]\nkind = "postgresql"\nurl = {json.dumps(pg_url)}\n'
                            'table = "story_results"')
    if store == "same":
        url = "sqlite:///results.db" if sink == "sqlite" else pg_url
        text = text.replace('path = "ckpt"', f"url = {json.dumps(url)}")
    spec.write_text(text)
    return spec


def _num(v: Any) -> Any:
    if isinstance(v, Decimal):
        return int(v) if v == v.to_integral_value() and "E" not in str(v) and "." not in str(
            v) else float(v)
    return v


def table_rows(d: Path, sink: str, pg_url: str | None) -> list[dict[str, Any]]:
    """The results table as JSON-output-like rows."""
    cols = ("key", "key_is_int", "window_start", "window_end", *AGGS)
    sql = "SELECT " + ", ".join(f'"{c}"' for c in cols) + " FROM story_results"
    if sink == "sqlite":
        conn = sqlite3.connect(d / "results.db")
        try:
            raw = conn.execute(sql).fetchall()
        finally:
            conn.close()
    else:
        import psycopg

        with psycopg.connect(str(pg_url)) as pconn:
            raw = pconn.execute(sql).fetchall()
    out = []
    for r in raw:
        row = dict(zip(cols, r, strict=True))
        key = int(row["key"]) if row.pop("key_is_int") else row["key"]
        res = {"key": key, "window_start": row["window_start"], "window_end": row["window_end"]}
        for a in AGGS:
            v = row[a]
            if a in ("first_i", "last_amount") and sink == "sqlite" and v is not None:
                v = json.loads(v)
            res[a] = _num(v)
        out.append(res)
    return out


def assert_table_equals(d: Path, sink: str, pg_url: str | None, expected: Path) -> None:
    got = table_rows(d, sink, pg_url)
    want = {(type(r["key"]).__name__, r["key"], r["window_start"], r["window_end"]): r
            for r in committed(expected, "out")}
    ids = [(type(r["key"]).__name__, r["key"], r["window_start"], r["window_end"]) for r in got]
    assert len(ids) == len(set(ids))
    assert sorted(map(repr, ids)) == sorted(map(repr, want)), "different result ids"
    for r in got:
        exp = want[(type(r["key"]).__name__, r["key"], r["window_start"], r["window_end"])]
        for a in AGGS:
            v, e = r[a], exp[a]
            if isinstance(e, float) or isinstance(v, float):
                assert v is not None and e is not None
                assert math.isclose(float(v), float(e), rel_tol=1e-9, abs_tol=1e-12), (a, v, e)
            else:
                assert v == e and type(v) is type(e), (a, v, e)


def assert_files_equal(d: Path, expected: Path) -> None:
    """Late events and bad records (files) are exactly those of the uninterrupted run."""
    (d / "out").mkdir(exist_ok=True)
    exp = expected / "_noout"
    if not exp.exists():
        exp.mkdir()
        for sub in ("late", "errors"):
            (exp / sub).symlink_to(expected / sub)
    assert_same_output(d, exp)


CASES = [("sqlite", "same"), ("sqlite", "dir"), ("postgresql", "same"), ("postgresql", "dir")]
POINTS = ["after_sink_prepare", "before_manifest_publish", "after_manifest_publish",
          "after_commit_results", "after_retention"]


# every step when the results commit with the checkpoint; the sink's own steps otherwise
STEPS = [(sink, store, point) for sink, store in CASES for point in POINTS
         if (store == "same" and point != "after_commit_results")
         or point in ("after_sink_prepare", "after_manifest_publish", "after_commit_results")]


@pytest.mark.parametrize("sink,store,point", STEPS)
def test_kill_at_a_step_then_resume(tmp_path: Path, expected: Path, request: pytest.FixtureRequest,
                                    sink: str, store: str, point: str) -> None:
    pg_url = request.getfixturevalue("pg_url") if sink == "postgresql" else None
    spec = _spec(tmp_path, sink, store, pg_url)
    crashed = run(spec, crash_at=f"{point}:3")
    assert crashed.returncode == -9, f"{point} was not reached: {crashed.stderr}"
    resumed = run_here(spec)
    assert resumed.returncode == 0, resumed.stderr
    assert_table_equals(tmp_path, sink, pg_url, expected)
    assert_files_equal(tmp_path, expected)
    if point == "after_retention":
        again = run_here(spec)  # a finished job run again changes nothing
        assert again.returncode == 0, again.stderr
        assert_table_equals(tmp_path, sink, pg_url, expected)


@pytest.mark.parametrize("sink", ["sqlite", "postgresql"])
def test_results_commit_in_the_checkpoint_transaction(
        tmp_path: Path, request: pytest.FixtureRequest, sink: str) -> None:
    """Same database: after a kill right after the publishing commit, every checkpoint's
    receipts match the table exactly - the table never runs ahead or behind."""
    pg_url = request.getfixturevalue("pg_url") if sink == "postgresql" else None
    spec = _spec(tmp_path, sink, "same", pg_url)
    crashed = run(spec, crash_at="after_manifest_publish:4")
    assert crashed.returncode == -9, crashed.stderr
    rows = table_rows(tmp_path, sink, pg_url)
    url = "sqlite:///" + str(tmp_path / "results.db") if sink == "sqlite" else str(pg_url)
    from sealstream.checkpoint.stores import open_store

    st = open_store(url, "story")
    try:
        newest = max(st.ids())
        doc = st.read_manifest(newest)
        assert doc is not None
        assert doc["receipts"]["results"] == len(rows) > 0
        staged = _staged_count(tmp_path, sink, pg_url)
        assert staged == 0  # nothing staged: the rows went in with the manifest
    finally:
        st.close()


def _staged_count(d: Path, sink: str, pg_url: str | None) -> int:
    sql = "SELECT count(*) FROM sealstream_sink_staging"
    if sink == "sqlite":
        conn = sqlite3.connect(d / "results.db")
        try:
            return int(conn.execute(sql).fetchone()[0])
        finally:
            conn.close()
    import psycopg

    with psycopg.connect(str(pg_url)) as pconn:
        row = pconn.execute(sql).fetchone()
        assert row is not None
        return int(row[0])


@pytest.mark.slow
@pytest.mark.parametrize("sink,store", [("postgresql", "same"), ("sqlite", "dir")])
def test_random_kills(tmp_path: Path, expected: Path, request: pytest.FixtureRequest,
                      sink: str, store: str) -> None:
    pg_url = request.getfixturevalue("pg_url") if sink == "postgresql" else None
    # how long this configuration takes here and now (the machine may be loaded)
    timing = tmp_path / "timing"
    timing.mkdir()
    started = time.monotonic()
    assert run(_spec(timing, sink, "dir", None if sink == "sqlite" else pg_url)).returncode == 0
    typical = time.monotonic() - started
    if sink == "postgresql":  # the timing run wrote into the same database: start afresh
        import psycopg

        with psycopg.connect(str(pg_url), autocommit=True) as conn:
            conn.execute("DROP TABLE story_results")
            conn.execute("DROP TABLE sealstream_sink_commits")
            conn.execute("DROP TABLE sealstream_sink_staging")
    spec = _spec(tmp_path, sink, store, pg_url)
    kills = run_killed_randomly(spec, random.Random(f"{sink}{store}"), typical,
                                reset=None if pg_url is None else lambda: _drop_tables(pg_url))
    assert kills >= 1
    assert_table_equals(tmp_path, sink, pg_url, expected)
    assert_files_equal(tmp_path, expected)


def _drop_tables(pg_url: str) -> None:
    """Every table of the test's own database: a run that finished before its kill
    timer starts over from nothing."""
    import psycopg

    with psycopg.connect(str(pg_url), autocommit=True) as conn:
        names = [r[0] for r in conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()")]
        for name in names:
            conn.execute(f'DROP TABLE IF EXISTS "{name}" CASCADE')


def test_a_table_that_does_not_fit_is_refused(tmp_path: Path) -> None:
    spec = _spec(tmp_path, "sqlite", "dir", None)
    conn = sqlite3.connect(tmp_path / "results.db")
    conn.execute("CREATE TABLE story_results (key TEXT, window_start INTEGER)")
    conn.commit()
    conn.close()
    res = run_here(spec)
    assert res.returncode != 0
    line = res.stderr.strip().splitlines()[-1]
    assert "story_results" in line and "does not fit" in line and "key_is_int" in line


@pytest.mark.parametrize("sink", ["sqlite", "postgresql"])
def test_replay_of_a_job_with_a_table_and_a_database_store(
        tmp_path: Path, expected: Path, request: pytest.FixtureRequest, sink: str) -> None:
    """Replay reads the checkpoints from the database and writes the results as JSONL
    files under its destination: the live table is never written (it used to refuse
    such jobs: 'an output of kind ... has no path')."""
    import subprocess

    pg_url = request.getfixturevalue("pg_url") if sink == "postgresql" else None
    spec = _spec(tmp_path, sink, "same", pg_url)
    assert run_here(spec).returncode == 0
    rows = table_rows(tmp_path, sink, pg_url)

    def replay(origin: str, to: Path) -> subprocess.CompletedProcess[str]:
        return in_process("replay", str(spec), "--from", origin, "--to", str(to), "--json")

    res = replay("start", tmp_path / "rp")
    assert res.returncode == 0, res.stderr
    assert_same_output(tmp_path / "rp", expected)
    listed = in_process("checkpoints", "list",
                        *(["--pipeline", "story"] if sink == "postgresql" else []),
                        "sqlite:///" + str(tmp_path / "results.db") if sink == "sqlite"
                        else str(pg_url), "--json")
    assert listed.returncode == 0, listed.stderr
    cid = json.loads(listed.stdout)["checkpoints"][0]["id"]
    res = replay(str(cid), tmp_path / "rp-id")
    assert res.returncode == 0, res.stderr
    assert table_rows(tmp_path, sink, pg_url) == rows  # the live table is untouched
    if sink == "sqlite":
        res = replay("start", tmp_path)  # the directory holding the live database file
        assert res.returncode == 2 and "results.db" in res.stderr, res.stderr


@pytest.mark.parametrize("sink", ["sqlite", "postgresql"])
@pytest.mark.parametrize("first", ["alpha", "beta"])
def test_a_results_table_belongs_to_one_pipeline(
        tmp_path: Path, expected: Path, request: pytest.FixtureRequest, sink: str,
        first: str) -> None:
    """Two jobs, one results table: the job that used it first keeps it. The other is
    refused at start (exit 1, naming the table and the owner) before it touches the
    owner's staged rows, so the owner, killed with an epoch staged, resumes exactly
    (it used to fail on every rerun: 'the staged rows are gone')."""
    pg_url = request.getfixturevalue("pg_url") if sink == "postgresql" else None
    second = "beta" if first == "alpha" else "alpha"
    owner_dir, other_dir = tmp_path / first, tmp_path / second
    owner_dir.mkdir()
    other_dir.mkdir()
    owner = _spec(owner_dir, sink, "dir", pg_url)
    other = _spec(other_dir, sink, "dir", pg_url)
    owner.write_text(owner.read_text().replace('name = "story"', f'name = "{first}"'))
    text = other.read_text().replace('name = "story"', f'name = "{second}"')
    other.write_text(text.replace('"sqlite:///results.db"',
                                  json.dumps(f"sqlite:///{owner_dir / 'results.db'}")))
    crashed = run(owner, crash_at="after_manifest_publish:2")  # an epoch staged, uncommitted
    assert crashed.returncode == -9, crashed.stderr
    staged = _staged_count(owner_dir, sink, pg_url)
    assert staged >= 1
    refused = run_here(other)
    assert refused.returncode == 1, refused.stderr
    line = refused.stderr.strip().splitlines()[-1]
    assert "table 'story_results' in " in line and f"results of pipeline {first!r}" in line
    assert f"pipeline {second!r} cannot share it" in line and "sink.table" in line, line
    assert _staged_count(owner_dir, sink, pg_url) == staged  # untouched
    resumed = run_here(owner)
    assert resumed.returncode == 0, resumed.stderr
    assert_table_equals(owner_dir, sink, pg_url, expected)
    assert_files_equal(owner_dir, expected)
    assert run_here(other).returncode == 1  # still the owner's
    assert_table_equals(owner_dir, sink, pg_url, expected)
