"""The database result sink (SQLite and PostgreSQL, real servers): two-phase
contract, idempotent upserts by id, exact values, recovery, and tables that do
not fit. The same tests run on both dialects."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from sealstream.errors import SinkError
from sealstream.sinks.database import DatabaseSink
from sealstream.testing.sink_contract import results_frame

AGGS = {"n": "count", "total": "sum", "avg": "mean", "first_v": "first"}
ROW = {"key": "k", "window_start": 0, "window_end": 10, "n": 1, "total": 2, "avg": 2.0,
       "first_v": 1}


@pytest.fixture(params=["sqlite", "postgresql"])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str | Path]]:
    if request.param == "sqlite":
        yield "sqlite", tmp_path / "r.db"
    else:
        yield "postgresql", str(request.getfixturevalue("pg_url"))


def make(db: tuple[str, str | Path], run: str = "run1", aggs: dict[str, str] | None = None,
         table: str = "results") -> DatabaseSink:
    return DatabaseSink(db[0], db[1], table, aggs or AGGS, run, shown="test-db")


def query(db: tuple[str, str | Path], sql: str) -> list[tuple[Any, ...]]:
    if db[0] == "sqlite":
        conn = sqlite3.connect(db[1])
        try:
            return conn.execute(sql).fetchall()
        finally:
            conn.close()
    import psycopg

    with psycopg.connect(str(db[1])) as c:
        return c.execute(sql).fetchall()


def rows(db: tuple[str, str | Path]) -> dict[tuple[str, bool, int, int], tuple[Any, ...]]:
    out = {}
    for r in query(db, 'SELECT key, key_is_int, window_start, window_end, n, total, avg, '
                       'first_v FROM results'):
        # JSON text in SQLite; PostgreSQL's JSONB arrives parsed
        first = json.loads(r[7]) if db[0] == "sqlite" and r[7] is not None else r[7]
        total = r[5]
        if isinstance(total, Decimal):
            total = int(total) if total == total.to_integral_value() else float(total)
        out[(r[0], bool(r[1]), r[2], r[3])] = (r[4], total, r[6], first)
    return out


def frame(spec: list[tuple[Any, int, int, Any, Any]]) -> pl.DataFrame:
    """(key, window_start, n, total, first) -> a results frame as the engine hands it."""
    data = [{"key": k, "window_start": ws, "window_end": ws + 10, "n": n, "total": t,
             "avg": None if t is None else float(t) / n, "first_v": f}
            for k, ws, n, t, f in spec]
    # the typed columns are not what the sink reads (the per-row JSON line is)
    return results_frame(data).with_columns(pl.lit(None).alias(c) for c in AGGS)


def test_prepare_commit_is_exactly_once_and_idempotent(db: tuple[str, str | Path]) -> None:
    sink = make(db)
    sink.recover({})
    sink.write(1, frame([("a", 0, 2, 5, 1), (7, 0, 1, 2.5, 2)]))
    tokens = sink.prepare(1)
    assert len(tokens) == 1 and query(db, "SELECT count(*) FROM results") == [(0,)]
    sink.commit(1, tokens)
    sink.commit(1, tokens)  # again: nothing changes
    assert rows(db) == {("a", False, 0, 10): (2, 5, 2.5, 1), ("7", True, 0, 10): (1, 2.5, 2.5, 2)}
    assert [f.epoch for f in sink.committed()] == [1]
    ids = sink.read_ids(sink.committed())
    assert sorted(ids.rows()) == [("7", True, 0, 10), ("a", False, 0, 10)]
    assert sink.prepare(2) == []  # an epoch without rows
    sink.close()


def test_recover_commits_prepared_and_drops_other_staging(db: tuple[str, str | Path]) -> None:
    sink = make(db, "runA")
    sink.recover({})
    sink.write(3, frame([("x", 0, 1, 1, None)]))
    prepared = sink.prepare(3)
    sink.write(4, frame([("y", 0, 1, 1, None)]))
    unreferenced = sink.prepare(4)
    sink.close()  # "crash": neither committed
    after = make(db, "runB")
    after.recover({3: prepared})
    assert set(rows(db)) == {("x", False, 0, 10)}
    assert query(db, "SELECT count(*) FROM sealstream_sink_staging") == [(0,)]
    with pytest.raises(SinkError, match="staged rows are gone"):
        after.commit(4, unreferenced)
    after.recover({3: prepared})  # idempotent
    assert len(after.committed()) == 1
    after.close()


def test_upsert_by_id_and_exact_values(db: tuple[str, str | Path]) -> None:
    sink = make(db)
    sink.recover({})
    big = 2**70 + 1  # beyond int64: exact in NUMERIC
    weird = 'q"uo\\te\u00e9\n'
    sink.write(1, frame([(weird, -20, 3, big, "s"), ("1", 0, 1, 1, {"a": [1]})]))
    sink.commit(1, sink.prepare(1))
    sink.write(2, frame([(weird, -20, 4, 0.1, "t")]))  # the same id again: replaced
    sink.commit(2, sink.prepare(2))
    got = rows(db)
    assert got[(weird, False, -20, -10)][:2] == (4, 0.1)
    assert got[("1", False, 0, 10)][3] == {"a": [1]}  # "1" the string, not 1 the integer
    if db[0] == "postgresql":
        sink.write(3, frame([("b", 0, 3, big, 1)]))
        sink.commit(3, sink.prepare(3))
        assert query(db, "SELECT total FROM results WHERE key = 'b'") == [(Decimal(big),)]
    sink.close()


def test_a_table_that_does_not_fit_is_refused(db: tuple[str, str | Path]) -> None:
    first = make(db, aggs={"n": "count"})
    first.recover({})
    first.close()
    other = make(db, aggs={"n": "count", "total": "sum"})
    with pytest.raises(SinkError, match="does not fit this pipeline: it has no column 'total'"):
        other.recover({})
    query(db, "DROP TABLE results") if db[0] == "sqlite" else None
    if db[0] == "postgresql":
        import psycopg

        with psycopg.connect(str(db[1]), autocommit=True) as c:
            c.execute("DROP TABLE results")
            c.execute("CREATE TABLE results (key TEXT, key_is_int BOOLEAN, window_start BIGINT,"
                      " window_end BIGINT, n TEXT)")
        wrong = make(db, aggs={"n": "count"})
        with pytest.raises(SinkError, match="column 'n' is TEXT, expected BIGINT"):
            wrong.recover({})


def test_bad_names_and_roles() -> None:
    with pytest.raises(SinkError, match="not a valid table name"):
        DatabaseSink("sqlite", "x.db", "1bad", AGGS, "r", shown="x")
    with pytest.raises(SinkError, match="rename the aggregate"):
        DatabaseSink("sqlite", "x.db", "t", {"window_end": "count"}, "r", shown="x")
    with pytest.raises(SinkError, match="can only hold results"):
        DatabaseSink("sqlite", "x.db", "t", AGGS, "r", shown="x", role="records")


def test_a_table_of_another_pipeline_is_refused_and_its_staging_kept(
        db: tuple[str, str | Path]) -> None:
    """Pipeline b may not take pipeline a's table: refused when it opens it, naming the
    table and a, before its recovery could drop a's staged rows."""
    a = DatabaseSink(db[0], db[1], "results", AGGS, "runa", shown="test-db", pipeline="a")
    a.recover({})
    a.write(1, results_frame([ROW]))
    tokens = a.prepare(1)
    b = DatabaseSink(db[0], db[1], "results", AGGS, "runb", shown="test-db", pipeline="b")
    with pytest.raises(SinkError, match="table 'results' in test-db holds the results of "
                                        "pipeline 'a'; pipeline 'b' cannot share it"):
        b.recover({})
    b.close()
    a.close()
    again = DatabaseSink(db[0], db[1], "results", AGGS, "runa2", shown="test-db", pipeline="a")
    again.recover({1: tokens})  # a's staged rows are still there to commit
    assert len(rows(db)) == 1
    again.close()


def test_staged_rows_of_other_pipelines_and_older_versions(db: tuple[str, str | Path]) -> None:
    """A staging table without the pipeline column (an older version) gets it; a
    job's recovery drops its own and unowned staging, never another pipeline's."""
    blob = "BYTEA" if db[0] == "postgresql" else "BLOB"
    sql = [f"CREATE TABLE sealstream_sink_staging (tbl TEXT NOT NULL, token TEXT NOT NULL, "
           f"epoch BIGINT NOT NULL, data {blob} NOT NULL, PRIMARY KEY (tbl, token))",
           "INSERT INTO sealstream_sink_staging VALUES ('results', 'old', 1, 'x')"]
    if db[0] == "sqlite":
        conn = sqlite3.connect(db[1])
        for q in sql:
            conn.execute(q)
        conn.commit()
        conn.close()
    else:
        import psycopg

        with psycopg.connect(str(db[1]), autocommit=True) as c:
            for q in sql:
                c.execute(q)
    a = DatabaseSink(db[0], db[1], "results", AGGS, "runa", shown="test-db", pipeline="a")
    a.recover({})  # migrates, then drops the unowned row
    assert query(db, "SELECT count(*) FROM sealstream_sink_staging") == [(0,)]
    a.write(2, results_frame([ROW]))
    a.prepare(2)
    a.close()
    # another pipeline's staged row in the same staging table (another table of its own)
    c = DatabaseSink(db[0], db[1], "other", AGGS, "runc", shown="test-db", pipeline="c")
    c.recover({})
    c.close()
    assert query(db, "SELECT tbl, pipeline FROM sealstream_sink_staging") == [("results", "a")]
