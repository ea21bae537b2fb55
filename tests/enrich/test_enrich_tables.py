"""``[[enrich]]`` tables from a SQLite query, a PostgreSQL query (real server) and a
compacted Kafka topic read as a changelog (real broker): the same as-of join, and
each version bound in the checkpoint (docs/enrich.md)."""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path
from typing import Any

import confluent_kafka as ck
import pytest
from _enrich import jsonl, results, run, spec_text

from sealstream import Job, load_spec
from sealstream.checkpoint.manifest import KEY_ENV

EVENTS = [
    {"user": "u1", "ts": 1000, "amount": 10},
    {"user": "u2", "ts": 2000, "amount": 5},
    {"user": "u1", "ts": 6000, "amount": 7},
    {"user": "u2", "ts": 9000, "amount": 1},
]


@pytest.fixture(autouse=True)
def _no_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(KEY_ENV, raising=False)


def job(d: Path, enrich: str, events: list[dict[str, Any]] = EVENTS) -> Path:
    (d / "in").mkdir(parents=True, exist_ok=True)
    (d / "in" / "p0.jsonl").write_text(jsonl(events))
    spec = d / "spec.toml"
    spec.write_text(spec_text(enrich, size_ms=5000))
    return spec


def countries(d: Path) -> dict[tuple[str, int], str | None]:
    return {(r["key"], r["window_start"]): r["c"] for r in results(d)}


EXPECTED = {("u1", 0): "FR", ("u2", 0): "US", ("u1", 5000): "DE", ("u2", 5000): "US"}


def test_a_sqlite_query(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with sqlite3.connect(tmp_path / "ref.db") as conn:
        conn.execute("CREATE TABLE users (id TEXT, country TEXT, since INTEGER)")
        conn.executemany("INSERT INTO users VALUES (?, ?, ?)",
                         [("u1", "FR", 0), ("u1", "DE", 5000), ("u2", "US", 0)])
    spec = job(tmp_path, '[[enrich]]\nname = "users"\nkind = "sqlite"\n'
               'url = "sqlite:///ref.db"\non = "user"\nvalid_from = "since"\n'
               'query = "SELECT id AS user, country, since FROM users"\n')
    code, err = run(spec, capsys)
    assert code == 0, err
    assert countries(tmp_path) == EXPECTED


def test_a_postgresql_query_and_its_snapshot_version(
        tmp_path: Path, pg_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    import psycopg

    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE users (id TEXT, country TEXT, since BIGINT)")
        conn.execute("INSERT INTO users VALUES ('u2','US',0), ('u1','DE',5000), "
                     "('u1','FR',0)")
    spec = job(tmp_path, f'[[enrich]]\nname = "users"\nkind = "postgresql"\n'
               f'url = "{pg_url}"\non = "user"\nvalid_from = "since"\n'
               'query = "SELECT id AS user, country, since FROM users"\n')
    first = Job(load_spec(spec), stop_when=lambda j: True)
    first.run()
    with psycopg.connect(pg_url, autocommit=True) as conn:  # the same rows, another order
        conn.execute("CREATE TABLE tmp AS SELECT * FROM users ORDER BY id DESC")
        conn.execute("DROP TABLE users")
        conn.execute("ALTER TABLE tmp RENAME TO users")
    code, err = run(spec, capsys)
    assert code == 0, err
    assert countries(tmp_path) == EXPECTED
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("UPDATE users SET country = 'CA' WHERE id = 'u2'")
    code, err = run(spec, capsys)  # the finished job's checkpoint bound another version
    assert code == 1 and "table 'users'" in err


def test_an_unreachable_postgresql_fails_within_its_deadline(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from sealstream.testing.brokers import free_port

    port = free_port()
    spec = job(tmp_path, f'[[enrich]]\nname = "users"\nkind = "postgresql"\n'
               f'url = "postgresql://x@127.0.0.1:{port}/db"\non = "user"\n'
               'query = "SELECT 1"\nfail_after_ms = 1500\n')
    code, err = run(spec, capsys)
    assert code == 1
    assert err.startswith(f"sealstream: error: enrich.users: the PostgreSQL server at "
                          f"127.0.0.1:{port}/db cannot be reached (")
    assert len(err.splitlines()) == 1


def produce(bootstrap: str, topic: str, records: list[tuple[str, dict[str, Any] | None, int]]
            ) -> None:
    p = ck.Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for key, value, ts in records:
        p.produce(topic, None if value is None else json.dumps(value).encode(),
                  key=key.encode(), timestamp=ts)
    assert p.flush(30) == 0


def delete_topic(bootstrap: str, topic: str) -> None:
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})
    for f in admin.delete_topics([topic]).values():
        f.result(30)
    deadline = time.monotonic() + 60
    while topic in admin.list_topics(timeout=10).topics:  # deletion is asynchronous
        assert time.monotonic() < deadline, "the topic was not deleted"
        time.sleep(0.1)


def test_a_compacted_topic_read_as_a_changelog(
        tmp_path: Path, kafka: Any, capsys: pytest.CaptureFixture[str]) -> None:
    topic = kafka.new_topic(1, **{"cleanup.policy": "compact"})
    produce(kafka.bootstrap, topic, [
        ("u1", {"country": "FR"}, 1), ("u2", {"country": "US"}, 1),
        ("u1", {"country": "DE"}, 5000),
        ("u2", None, 8000),  # a tombstone: u2 has no row from 8000 on
    ])
    spec = job(tmp_path, f'[[enrich]]\nname = "users"\nkind = "kafka"\n'
               f'bootstrap = "{kafka.bootstrap}"\ntopic = "{topic}"\non = "user"\n')
    first = Job(load_spec(spec), stop_when=lambda j: True)
    first.run()
    manifest = sorted((tmp_path / "ckpt").glob("cp-*/MANIFEST.json"))[-1]
    bound = json.loads(manifest.read_text())["enrich"]["users"]
    assert bound["positions"] == {"0": 4}
    # a newer version appended after the checkpoint is not joined by the resumed run:
    # it re-reads the topic up to the positions its checkpoint bound
    produce(kafka.bootstrap, topic, [("u1", {"country": "IT"}, 5500)])
    code, err = run(spec, capsys)
    assert code == 0, err
    assert countries(tmp_path) == {**EXPECTED, ("u2", 5000): None}


def test_a_deleted_changelog_topic_is_one_clear_error(
        tmp_path: Path, kafka: Any, capsys: pytest.CaptureFixture[str]) -> None:
    topic = kafka.new_topic(1)
    produce(kafka.bootstrap, topic, [("u1", {"country": "FR"}, 1)])
    spec = job(tmp_path, f'[[enrich]]\nname = "users"\nkind = "kafka"\n'
               f'bootstrap = "{kafka.bootstrap}"\ntopic = "{topic}"\non = "user"\n')
    Job(load_spec(spec), stop_when=lambda j: True).run()
    committed = results(tmp_path)
    delete_topic(kafka.bootstrap, topic)
    code, err = run(spec, capsys)
    assert code == 1
    assert err.splitlines() == [
        f"sealstream: error: enrich.users: changelog topic {topic!r} does not exist on "
        f"{kafka.bootstrap} (deleted?); the table cannot be read"]
    assert results(tmp_path) == committed


def test_a_changelog_of_several_partitions_equals_a_plain_reference(kafka: Any) -> None:
    """Records read in batches, a column per field: the newest version of each key at
    each timestamp (ties by offset, tombstones kept as absent) over three partitions."""
    from sealstream.enrich._changelog import load_changelog
    from sealstream.enrich._settings import Enrich

    topic = kafka.new_topic(3)
    records: list[tuple[str, dict[str, Any] | None, int]] = [
        (f"u{i % 37}", None if i % 11 == 0 else {"n": i}, 1 + 1000 * (i % 13)) for i in range(600)]
    produce(kafka.bootstrap, topic, records)
    table = load_changelog(Enrich(name="users", kind="kafka", on=("user",),
                                  bootstrap=kafka.bootstrap, topic=topic))
    # the reference: one partition per key, so the later record of a key and stamp is
    # the later one produced
    want: dict[tuple[str, int], int | None] = {}
    for key, value, ts in records:
        want[(key, ts)] = None if value is None else value["n"]
    got = {(r["user"], r["__vf"]): (r["n"] if r["__present"] else None)
           for r in table.frame.iter_rows(named=True)}
    assert got == want
    assert sum(table.version["positions"].values()) == len(records)


def test_a_changelog_value_that_is_not_utf8_names_partition_and_offset(kafka: Any) -> None:
    from sealstream.enrich._changelog import load_changelog
    from sealstream.enrich._settings import Enrich
    from sealstream.errors import SourceError

    topic = kafka.new_topic(1)
    p = ck.Producer({"bootstrap.servers": kafka.bootstrap})
    p.produce(topic, b'{"n": 1}', key=b"u1", timestamp=1)
    p.produce(topic, b'{"n": "\xff"}', key=b"u2", timestamp=2)
    assert p.flush(30) == 0
    with pytest.raises(SourceError) as info:
        load_changelog(Enrich(name="users", kind="kafka", on=("user",),
                              bootstrap=kafka.bootstrap, topic=topic))
    assert str(info.value) == (f"enrich.users: changelog topic {topic!r} partition 0 offset 1: "
                               "its value is not UTF-8 text")
