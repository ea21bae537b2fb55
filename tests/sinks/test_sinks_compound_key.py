"""Compound keys (``key = ["tenant", "user"]``) in the parquet, sqlite and postgresql
result sinks (real SQLite files and a real PostgreSQL server): one column per key
field, the identity (key fields..., window_start, window_end) for upserts and for
suppressing what a crashed run already committed, the same results as the jsonl
sink, exactly once through SIGKILLs at protocol steps, nothing new on a rerun, and
tables of another key shape refused."""

from __future__ import annotations

import json
import math
import sqlite3
from decimal import Decimal
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow.parquet as pq
import pytest

from scenarios._story import committed, run, run_here
from sealstream.errors import SinkError
from sealstream.sinks import CommittedFile, ParquetDirSink
from sealstream.sinks.database import DatabaseSink
from sealstream.sinks.parquet import KEY_JSON_FIELDS_METADATA
from sealstream.testing.specs import files_source, spec_text

FIELDS = ("tenant", "user")
AGGS = {"n": "count", "total": "sum(amount)", "avg": "mean(amount)", "last_i": "last(i)"}
DB_AGGS = {"n": "count", "total": "sum", "avg": "mean", "last_i": "last"}


# ------------------------------------------------------------------ frames as the engine
def key_text(values: dict[str, Any]) -> str:
    """A compound key's text as the transform stage builds it."""
    parts = []
    for f, v in values.items():
        if isinstance(v, float):
            text = str(pl.Series([v]).cast(pl.String)[0])
        else:
            text = json.dumps(v, ensure_ascii=False)
        parts.append(json.dumps(f) + ":" + text)
    return ",".join(parts)


def compound_frame(rows: list[tuple[dict[str, Any], int, int, int]]) -> pl.DataFrame:
    """(key values, window_start, n, total) -> a results frame as the engine hands it
    to sinks for a compound key (``key`` the key text, ``__kint`` False)."""
    lines = []
    for values, ws, n, total in rows:
        head = "{" + key_text(values)
        lines.append(head + f',"window_start":{ws},"window_end":{ws + 10},"n":{n},'
                     f'"total":{total},"avg":{total / n!r},"last_i":{n}}}')
    return pl.DataFrame({
        "key": [key_text(v) for v, *_ in rows],
        "__kint": [False] * len(rows),
        "window_start": [ws for _, ws, _, _ in rows],
        "window_end": [ws + 10 for _, ws, _, _ in rows],
        "n": [n for *_, n, _ in rows],
        "total": [t for *_, t in rows],
        "avg": [t / n for *_, n, t in rows],
        "last_i": [n for *_, n, _ in rows],
        "__json": lines,
    }, schema_overrides={"__kint": pl.Boolean})


ROWS = [
    ({"tenant": "acme", "user": 7}, 0, 1, 5),
    ({"tenant": "acme", "user": "7"}, 0, 2, 6),  # the string "7": another key
    ({"tenant": 'a,"b"\\c', "user": 7}, 0, 3, 7),  # quotes, comma, backslash
    ({"tenant": "zürich", "user": 7.0}, 10, 4, 8),  # a float: 7.0 is not 7
    ({"tenant": "acme", "user": True}, 10, 5, 9),
    ({"tenant": "acme", "user": -2**63}, 20, 6, 10),
]


def engine_ids(frame: pl.DataFrame) -> list[tuple[Any, ...]]:
    return sorted(frame.select("key", "__kint", "window_start", "window_end").rows())


# ------------------------------------------------------------------ parquet, sink level
def test_parquet_writes_a_column_per_key_field_and_reads_back_the_identity(
        tmp_path: Path) -> None:
    sink = ParquetDirSink(tmp_path, run_token="r")
    sink.key_fields = FIELDS
    frame = compound_frame(ROWS)
    sink.write(1, frame)
    (token,) = sink.prepare(1)
    sink.commit(1, [token])
    df = pl.read_parquet(tmp_path / token)
    assert df.columns == ["tenant", "user", "window_start", "window_end", "n", "total", "avg",
                          "last_i"]
    # tenant: every value a string; user mixes kinds: each value's JSON text
    assert df.schema["tenant"] == pl.String and df.schema["user"] == pl.String
    assert df.get_column("tenant").to_list()[:3] == ["acme", "acme", 'a,"b"\\c']
    assert df.get_column("user").to_list() == ["7", '"7"', "7", "7.0", "true",
                                               str(-2**63)]
    meta = pq.read_metadata(tmp_path / token).metadata
    assert json.loads(meta[KEY_JSON_FIELDS_METADATA.encode()]) == ["user"]
    got = sink.read_ids([CommittedFile(1, token)])
    assert engine_ids(got) == engine_ids(frame)


def test_a_null_in_a_boolean_key_column_is_refused_not_read_as_false(tmp_path: Path) -> None:
    """A committed file whose boolean key column holds a null (the engine never writes
    one: a null key field makes its record bad) is refused on read-back; reading it
    as ``false`` would suppress another key's result."""
    sink = ParquetDirSink(tmp_path, run_token="r")
    sink.key_fields = FIELDS
    sink.write(1, compound_frame([({"tenant": "t", "user": True}, 0, 1, 1),
                                  ({"tenant": "t", "user": False}, 0, 1, 1)]))
    (token,) = sink.prepare(1)
    sink.commit(1, [token])
    df = pl.read_parquet(tmp_path / token)
    assert df.schema["user"] == pl.Boolean
    df.with_columns(pl.when(pl.col("user")).then(None).otherwise(pl.col("user"))
                    .alias("user")).write_parquet(tmp_path / token)
    with pytest.raises(SinkError, match="a key column holds a null"):
        sink.read_ids([CommittedFile(1, token)])


@pytest.mark.parametrize("values,dtype", [
    ([7, -3, 2**62], pl.Int64), (["u1", "7"], pl.String), ([1.5, 7.0, 1e20], pl.Float64),
    ([True, False], pl.Boolean)])
def test_parquet_key_field_columns_have_their_natural_type(
        tmp_path: Path, values: list[Any], dtype: pl.DataType) -> None:
    sink = ParquetDirSink(tmp_path, run_token="r")
    sink.key_fields = FIELDS
    frame = compound_frame([({"tenant": "t", "user": v}, 0, 1, 1) for v in values])
    sink.write(3, frame)
    (token,) = sink.prepare(3)
    sink.commit(3, [token])
    df = pl.read_parquet(tmp_path / token)
    assert df.schema["tenant"] == pl.String and df.schema["user"] == dtype
    assert df.get_column("user").to_list() == values
    assert KEY_JSON_FIELDS_METADATA.encode() not in (pq.read_metadata(tmp_path / token).metadata
                                                     or {})
    assert engine_ids(sink.read_ids([CommittedFile(3, token)])) == engine_ids(frame)


# ------------------------------------------------------------------ databases, sink level
@pytest.fixture(params=["sqlite", "postgresql"])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, str | Path]:
    if request.param == "sqlite":
        return "sqlite", tmp_path / "r.db"
    return "postgresql", str(request.getfixturevalue("pg_url"))


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


def make_db(db: tuple[str, str | Path], fields: tuple[str, ...] | None = FIELDS,
            run: str = "run1") -> DatabaseSink:
    sink = DatabaseSink(db[0], db[1], "results", DB_AGGS, run, shown="test-db")
    sink.key_fields = fields
    return sink


def test_database_table_has_a_column_per_key_field_and_upserts_by_identity(
        db: tuple[str, str | Path]) -> None:
    sink = make_db(db)
    sink.recover({})
    frame = compound_frame(ROWS)
    sink.write(1, frame)
    tokens = sink.prepare(1)
    sink.commit(1, tokens)
    sink.commit(1, tokens)  # committed once
    sink.close()
    got = query(db, 'SELECT tenant, "user", key_types, window_start, window_end, n FROM '
                    "results ORDER BY n")
    assert got == [("acme", "7", "si", 0, 10, 1), ("acme", "7", "ss", 0, 10, 2),
                   ('a,"b"\\c', "7", "si", 0, 10, 3), ("zürich", "7.0", "sf", 10, 20, 4),
                   ("acme", "true", "sb", 10, 20, 5), ("acme", str(-2**63), "si", 20, 30, 6)]
    again = make_db(db, run="run2")  # a rerun upserts the same ids: no new row
    again.recover({})
    assert engine_ids(again.read_ids(again.committed())) == engine_ids(frame)
    again.write(2, frame.with_columns(pl.col("n") * 0))
    again.commit(2, again.prepare(2))
    again.close()
    assert query(db, "SELECT count(*) FROM results") == [(len(ROWS),)]
    if db[0] == "sqlite":
        pk = [r[1] for r in sorted(query(db, "PRAGMA table_info(results)"), key=lambda r: r[5])
              if r[5]]
    else:
        pk = [r[0] for r in query(db, "SELECT a.attname FROM pg_index i JOIN pg_attribute a "
                                      "ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) "
                                      "WHERE i.indrelid = 'results'::regclass AND i.indisprimary "
                                      "ORDER BY array_position(i.indkey::int2[], a.attnum)")]
    assert pk == ["tenant", "user", "key_types", "window_start", "window_end"]


def test_database_quotes_field_names(db: tuple[str, str | Path]) -> None:
    fields = ('te"nant', "order by")
    sink = make_db(db, fields)
    sink.recover({})
    frame = compound_frame([({fields[0]: "a", fields[1]: 1}, 0, 1, 1)])
    sink.write(1, frame)
    sink.commit(1, sink.prepare(1))
    assert engine_ids(sink.read_ids(sink.committed())) == engine_ids(frame)
    sink.close()
    assert query(db, 'SELECT "te""nant", "order by", key_types FROM results') == [
        ("a", "1", "si")]


SINGLE = "a single key \\(key, key_is_int, window_start, window_end\\)"


@pytest.mark.parametrize("first,then,why", [
    (None, FIELDS, f"{SINGLE}, this pipeline's by the compound key \\(tenant, user\\)"),
    (FIELDS, None, f"the compound key \\(tenant, user\\), this pipeline's by {SINGLE}"),
    (FIELDS, ("tenant",), "the compound key \\(tenant, user\\), this pipeline's by the "
                          "compound key \\(tenant\\)"),
    (FIELDS, ("user", "tenant"), "the compound key \\(tenant, user\\), this pipeline's by "
                                 "the compound key \\(user, tenant\\)"),
])
def test_a_table_of_another_key_shape_is_refused(
        db: tuple[str, str | Path], first: tuple[str, ...] | None,
        then: tuple[str, ...] | None, why: str) -> None:
    made = make_db(db, first)
    made.recover({})
    made.close()
    other = make_db(db, then)
    with pytest.raises(SinkError, match="table 'results' in test-db does not fit this "
                                        f"pipeline: its results are identified by {why}; "
                                        "give this pipeline its own sink.table") as err:
        other.recover({})
    assert "\n" not in str(err.value)
    other.close()
    assert query(db, "SELECT count(*) FROM results") == [(0,)]


def test_key_field_names_a_table_cannot_hold_are_refused(tmp_path: Path) -> None:
    sink = DatabaseSink("sqlite", tmp_path / "r.db", "results", DB_AGGS, "r", shown="x")
    with pytest.raises(SinkError, match="'key_types' would name the same column"):
        sink.key_fields = ("tenant", "key_types")
    with pytest.raises(SinkError, match="'User' would name the same column of table "
                                        "'results' as key field 'user'"):
        sink.key_fields = ("user", "User")  # one column for SQLite
    with pytest.raises(SinkError, match="'N' would name the same column .* as an aggregate"):
        sink.key_fields = ("N",)
    pg = DatabaseSink("postgresql", "postgresql://x@h/db", "results", DB_AGGS, "r", shown="x")
    with pytest.raises(SinkError, match="longer than the 63 bytes"):
        pg.key_fields = ("x" * 64,)


# ------------------------------------------------------------------ jobs (killed runs in
# subprocesses; the runs that are not killed in this process: _story.run_here)
def make_input(d: Path, events: int = 300) -> list[str]:
    import random

    rng = random.Random(3)
    (d / "in").mkdir(parents=True, exist_ok=True)
    names = []
    for p in range(2):
        t = 1_700_000_000_000
        lines = []
        for i in range(events):
            t += rng.randint(0, 300)
            ts = t - rng.randint(0, 700) - (4000 if rng.random() < 0.03 else 0)
            rec = {"tenant": rng.choice(["acme", 'glo,"bex"', "zürich"]),
                   "user": rng.choice([1, 2, "1", "u3"]), "ts": ts, "i": i,
                   "amount": rng.choice([rng.randint(0, 40), round(rng.uniform(0, 9), 2)])}
            lines.append(json.dumps(rec))
        names.append(f"in/p{p}.jsonl")
        (d / names[-1]).write_text("\n".join(lines) + "\n")
    return names


def sink_lines(sink: str, pg_url: str | None) -> str:
    if sink == "jsonl":
        return 'kind = "jsonl"\npath = "out"'
    if sink == "parquet":
        return 'kind = "parquet"\npath = "out"'
    url = "sqlite:///results.db" if sink == "sqlite" else pg_url
    return f'kind = "{sink}"\nurl = {json.dumps(url)}\ntable = "ck_results"'


def write_job(d: Path, sink: str, pg_url: str | None = None, store: str = "dir") -> Path:
    names = make_input(d)
    checkpoint = 'path = "ckpt"'
    if store == "same":
        checkpoint = f"url = {json.dumps('sqlite:///results.db' if sink == 'sqlite' else pg_url)}"
    spec = d / "spec.toml"
    spec.write_text(spec_text(
        "ckey", files_source(names) + '\nkey = ["tenant", "user"]', key=None, batch_size=40,
        window='kind = "tumbling"\nsize_ms = 2000\nallowed_lateness_ms = 500',
        aggregates=AGGS, sink=sink_lines(sink, pg_url), late=True,
        checkpoint=checkpoint, every_events=90, keep=3))
    return spec


def _num(v: Any) -> Any:
    if isinstance(v, Decimal):
        text = str(v)
        return int(v) if "." not in text and "E" not in text else float(v)
    return v


_KIND = {"s": str, "i": int, "f": float, "b": lambda t: t == "true"}


def results(d: Path, sink: str, pg_url: str | None = None) -> list[dict[str, Any]]:
    """The job's results as JSON-output-like rows, whatever the sink."""
    if sink == "jsonl":
        return committed(d, "out")
    if sink == "parquet":
        out = []
        for f in sorted((d / "out").glob("part-*.parquet")):
            meta = pq.read_metadata(f).metadata or {}
            as_json = json.loads(meta.get(KEY_JSON_FIELDS_METADATA.encode(), b"[]"))
            for row in pl.read_parquet(f).to_dicts():
                for k in as_json:
                    row[k] = json.loads(row[k])
                out.append(row)
        return out
    cols = (*FIELDS, "key_types", "window_start", "window_end", *AGGS)
    sql = "SELECT " + ", ".join(f'"{c}"' for c in cols) + " FROM ck_results"
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
        kinds = row.pop("key_types")
        res = {f: _KIND[kind](row[f]) for f, kind in zip(FIELDS, kinds, strict=True)}
        res["window_start"], res["window_end"] = row["window_start"], row["window_end"]
        for a in AGGS:
            v = row[a]
            if a == "last_i" and sink == "sqlite" and v is not None:
                v = json.loads(v)
            res[a] = _num(v)
        out.append(res)
    return out


def _ident(r: dict[str, Any]) -> tuple[Any, ...]:
    return (*((type(r[f]).__name__, r[f]) for f in FIELDS), r["window_start"], r["window_end"])


def assert_same_results(got: list[dict[str, Any]], want: list[dict[str, Any]]) -> None:
    """Each result exactly once, equal to the reference (types kept)."""
    ids = [_ident(r) for r in got]
    assert len(ids) == len(set(ids)), "a result written twice"
    by_id = {_ident(r): r for r in want}
    assert sorted(map(repr, ids)) == sorted(map(repr, by_id)), "different result ids"
    for r in got:
        exp = by_id[_ident(r)]
        assert list(r)[:4] == [*FIELDS, "window_start", "window_end"]
        for k, e in exp.items():
            v = r[k]
            if isinstance(e, float) or isinstance(v, float):
                assert math.isclose(float(v), float(e), rel_tol=1e-9, abs_tol=1e-12), (k, v, e)
            else:
                assert type(v) is type(e) and v == e, (k, v, e)


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """The jsonl sink's results of an uninterrupted run."""
    d = tmp_path_factory.mktemp("ckey_ref")
    res = run_here(write_job(d, "jsonl"))
    assert res.returncode == 0, res.stderr
    rows = committed(d, "out")
    assert {type(r["user"]) for r in rows} == {int, str}
    assert {r["tenant"] for r in rows} == {"acme", 'glo,"bex"', "zürich"}
    return rows


def _pg(request: pytest.FixtureRequest, sink: str) -> str | None:
    return str(request.getfixturevalue("pg_url")) if sink == "postgresql" else None


@pytest.mark.parametrize("sink", ["parquet", "sqlite", "postgresql"])
def test_a_job_equals_the_jsonl_results_and_a_rerun_writes_nothing_new(
        tmp_path: Path, request: pytest.FixtureRequest, reference: list[dict[str, Any]],
        sink: str) -> None:
    pg_url = _pg(request, sink)
    spec = write_job(tmp_path, sink, pg_url)
    res = run_here(spec)
    assert res.returncode == 0, res.stderr
    first = results(tmp_path, sink, pg_url)
    assert_same_results(first, reference)
    files = sorted(p.name for p in (tmp_path / "out").glob("*")) if sink == "parquet" else []
    again = run_here(spec)
    assert again.returncode == 0, again.stderr
    assert results(tmp_path, sink, pg_url) == first
    if sink == "parquet":
        assert sorted(p.name for p in (tmp_path / "out").glob("*")) == files


KILLS = [("parquet", "dir", p) for p in ("after_sink_prepare", "before_manifest_publish",
                                         "after_manifest_publish", "after_commit_results")]
KILLS += [(s, "dir", p) for s in ("sqlite", "postgresql")
          for p in ("after_sink_prepare", "after_manifest_publish", "after_commit_results")]
KILLS += [(s, "same", p) for s in ("sqlite", "postgresql")
          for p in ("after_sink_prepare", "before_manifest_publish", "after_manifest_publish")]


@pytest.mark.parametrize("sink,store,point", KILLS)
def test_a_sigkill_at_a_step_then_resume_gives_each_result_once(
        tmp_path: Path, request: pytest.FixtureRequest, reference: list[dict[str, Any]],
        sink: str, store: str, point: str) -> None:
    pg_url = _pg(request, sink)
    spec = write_job(tmp_path, sink, pg_url, store)
    crashed = run(spec, crash_at=f"{point}:3")
    assert crashed.returncode == -9, f"{point} was not reached: {crashed.stderr}"
    resumed = run_here(spec)
    assert resumed.returncode == 0, resumed.stderr
    assert_same_results(results(tmp_path, sink, pg_url), reference)


@pytest.mark.parametrize("sink", ["parquet", "sqlite", "postgresql"])
def test_falling_back_to_an_older_checkpoint_suppresses_what_was_committed(
        tmp_path: Path, request: pytest.FixtureRequest, reference: list[dict[str, Any]],
        sink: str) -> None:
    """The newest checkpoint is damaged after results were committed past the older
    one: the resumed run replays from the older one and must recognise, by the
    identities it reads back from the sink, the results already there."""
    pg_url = _pg(request, sink)
    spec = write_job(tmp_path, sink, pg_url)
    assert run(spec, crash_at="after_retention:4").returncode == -9
    newest = sorted((tmp_path / "ckpt").glob("cp-*"))[-1]
    state = newest / "state.arrow"
    data = bytearray(state.read_bytes())
    data[len(data) // 2] ^= 1
    state.write_bytes(bytes(data))
    before = results(tmp_path, sink, pg_url)
    assert before
    resumed = run_here(spec)
    assert resumed.returncode == 0, resumed.stderr
    assert list((tmp_path / "ckpt" / "rejected").glob(f"{newest.name}-*"))  # it fell back
    assert_same_results(results(tmp_path, sink, pg_url), reference)


def test_jsonl_reads_back_the_identity_of_every_kind_of_key_field(tmp_path: Path) -> None:
    """A float key field keeps its fraction (7.0 and 7 are two keys), strings their
    escapes, booleans and integers their text."""
    from sealstream.sinks import JsonlDirSink

    sink = JsonlDirSink(tmp_path, "results", "r")
    sink.key_fields = FIELDS
    frame = compound_frame(ROWS)
    sink.write(1, frame)
    (token,) = sink.prepare(1)
    sink.commit(1, [token])
    assert engine_ids(sink.read_ids([CommittedFile(1, token)])) == engine_ids(frame)


@pytest.mark.parametrize("sink", ["sqlite", "postgresql"])
def test_a_job_into_a_table_of_a_single_key_is_refused_in_one_line(
        tmp_path: Path, request: pytest.FixtureRequest, sink: str) -> None:
    pg_url = _pg(request, sink)
    single = write_job(tmp_path / "single", sink, pg_url)
    text = single.read_text().replace('key = ["tenant", "user"]', 'key = "tenant"')
    if sink == "sqlite":  # the same database file for both jobs
        text = text.replace("sqlite:///results.db", f"sqlite:///{tmp_path / 'results.db'}")
    single.write_text(text.replace('name = "ckey"', 'name = "ckey1"'))
    assert run_here(single).returncode == 0
    count = query((sink, tmp_path / "results.db" if sink == "sqlite" else str(pg_url)),
                  "SELECT count(*) FROM ck_results")
    spec = write_job(tmp_path / "compound", sink, pg_url)
    spec.write_text(spec.read_text().replace("sqlite:///results.db",
                                             f"sqlite:///{tmp_path / 'results.db'}")
                    .replace('name = "ckey"', 'name = "ckey1"'))
    res = run(spec)  # a subprocess: its whole stderr, whatever writes it, is one line
    assert res.returncode != 0
    lines = [x for x in res.stderr.splitlines() if x.strip()]
    assert len(lines) == 1, res.stderr
    assert "table 'ck_results' in " in lines[0] and (
        "does not fit this pipeline: its results are identified by a single key (key, "
        "key_is_int, window_start, window_end), this pipeline's by the compound key "
        "(tenant, user)") in lines[0], lines[0]
    assert query((sink, tmp_path / "results.db" if sink == "sqlite" else str(pg_url)),
                 "SELECT count(*) FROM ck_results") == count


def test_spec_refusals_that_remain(tmp_path: Path) -> None:
    """A table cannot take a field named key_types (its own column): exit 2 at
    validation, before anything runs."""
    spec = write_job(tmp_path, "sqlite")
    text = spec.read_text()
    spec.write_text(text.replace('key = ["tenant", "user"]', 'key = ["tenant", "key_types"]'))
    res = run_here(spec)
    assert res.returncode == 2 and "'key_types' names a column of the results table" in res.stderr
    assert not (tmp_path / "results.db").exists()


def test_parquet_files_of_another_key_are_named_as_such(tmp_path: Path) -> None:
    from sealstream.testing.sink_contract import results_frame

    single = ParquetDirSink(tmp_path, run_token="a")
    single.write(1, results_frame([{"key": "u1", "window_start": 0, "window_end": 10, "n": 1}]))
    (token,) = single.prepare(1)
    single.commit(1, [token])
    sink = ParquetDirSink(tmp_path, run_token="b")
    sink.key_fields = FIELDS
    with pytest.raises(SinkError, match="it holds the results of another key \\(its columns "
                                        "are key, window_start, window_end, n\\), this "
                                        "pipeline's key is written as tenant, user"):
        sink.read_ids(sink.committed())


def _kafka_results(kafka: Any, topic: str) -> list[dict[str, Any]]:
    """The topic's committed results; each message's key is the JSON object of the
    key fields, and its identity header names the result's window."""
    from sealstream.testing.kafka_read import read_committed

    out = []
    for m in read_committed(kafka.bootstrap, topic):
        value = json.loads(m.value)
        assert json.loads(m.key) == {f: value[f] for f in FIELDS}
        assert list(json.loads(m.key)) == list(FIELDS)
        ident = json.loads(dict(m.headers)["sealstream-id"])
        assert (ident["window_start"], ident["window_end"]) == (value["window_start"],
                                                                value["window_end"])
        out.append(value)
    return out


def _kafka_job(tmp_path: Path, kafka: Any) -> tuple[Path, str]:
    topic = kafka.new_topic(3)
    spec = write_job(tmp_path, "jsonl")
    spec.write_text(spec.read_text().replace(
        'kind = "jsonl"\npath = "out"',
        f'kind = "kafka"\nbootstrap = "{kafka.bootstrap}"\ntopic = "{topic}"'))
    return spec, topic


@pytest.mark.parametrize("point", ["kafka_in_transaction", "after_manifest_publish"])
def test_kafka_results_of_a_compound_key_are_exactly_once_through_a_sigkill(
        tmp_path: Path, kafka: Any, reference: list[dict[str, Any]], point: str) -> None:
    """Killed inside the epoch's transaction (rows at the broker, not committed) or
    right after the manifest: the resumed run commits each result once, keyed by
    the fields' JSON object; a rerun produces nothing."""
    spec, topic = _kafka_job(tmp_path, kafka)
    crashed = run(spec, crash_at=f"{point}:3")
    assert crashed.returncode == -9, f"{point} was not reached: {crashed.stderr}"
    resumed = run_here(spec)
    assert resumed.returncode == 0, resumed.stderr
    first = _kafka_results(kafka, topic)
    assert_same_results(first, reference)
    again = run_here(spec)
    assert again.returncode == 0, again.stderr
    assert len(_kafka_results(kafka, topic)) == len(first)


def test_kafka_fallback_to_an_older_checkpoint_suppresses_what_was_committed(
        tmp_path: Path, kafka: Any, reference: list[dict[str, Any]]) -> None:
    """The compound identities read back from the topic's headers are what the
    resumed run suppresses after falling back past a damaged newest checkpoint."""
    spec, topic = _kafka_job(tmp_path, kafka)
    assert run(spec, crash_at="after_retention:4").returncode == -9
    newest = sorted((tmp_path / "ckpt").glob("cp-*"))[-1]
    state = newest / "state.arrow"
    data = bytearray(state.read_bytes())
    data[len(data) // 2] ^= 1
    state.write_bytes(bytes(data))
    assert _kafka_results(kafka, topic)
    resumed = run_here(spec)
    assert resumed.returncode == 0, resumed.stderr
    assert list((tmp_path / "ckpt" / "rejected").glob(f"{newest.name}-*"))  # it fell back
    assert_same_results(_kafka_results(kafka, topic), reference)
