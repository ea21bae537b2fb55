"""Reference tables that cannot be joined as promised: one clear line each, the
exit code of the contract (2: the spec names something absent; 1: a runtime
failure), and nothing committed lost (docs/enrich.md)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from _enrich import jsonl, results, run, spec_text

from sealstream import Job, load_spec
from sealstream.checkpoint.manifest import KEY_ENV

EVENTS = [{"user": f"u{i % 3}", "ts": i * 1000, "amount": i} for i in range(30)]
CSV = "user,country\nu0,FR\nu1,DE\nu2,US\n"
ENRICH = '[[enrich]]\nname = "users"\nkind = "csv"\npath = "users.csv"\non = "user"\n'


@pytest.fixture(autouse=True)
def _no_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(KEY_ENV, raising=False)


def job(d: Path, table: str | None = CSV, enrich: str = ENRICH) -> Path:
    (d / "in").mkdir(parents=True, exist_ok=True)
    (d / "in" / "p0.jsonl").write_text(jsonl(EVENTS))
    if table is not None:
        (d / "users.csv").write_text(table)
    spec = d / "spec.toml"
    spec.write_text(spec_text(enrich, size_ms=5000))
    return spec


def one_line(err: str) -> str:
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("sealstream: error: "), err
    return lines[0]


def test_a_table_changed_between_runs_is_refused_then_accepted(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = job(tmp_path)
    first = Job(load_spec(spec), stop_when=lambda j: j.counters.events >= 12)
    first.run()
    committed = results(tmp_path)
    assert committed and all(r["c"] == {"u0": "FR", "u1": "DE", "u2": "US"}[r["key"]]
                             for r in committed)
    manifests = sorted((tmp_path / "ckpt").glob("cp-*/MANIFEST.json"))
    bound = json.loads(manifests[-1].read_text())["enrich"]["users"]
    assert bound["rows"] == 3 and len(bound["sha256"]) == 64

    (tmp_path / "users.csv").write_text(CSV.replace("FR", "BE"))
    code, err = run(spec, capsys)
    assert code == 1
    line = one_line(err)
    assert "checkpoint" in line and "table 'users'" in line
    assert "--accept-table-change" in line and "--start-over" in line
    assert results(tmp_path) == committed  # nothing committed lost or added

    (tmp_path / "users.csv").write_text(CSV)  # restored: resumes exactly
    assert run(spec, capsys)[0] == 0
    exact = results(tmp_path)
    assert {r["c"] for r in exact if r["key"] == "u0"} == {"FR"}

    # a job that accepts the change: the windows not yet emitted join the new rows
    again = tmp_path / "again"
    spec2 = job(again)
    Job(load_spec(spec2), stop_when=lambda j: j.counters.events >= 12).run()
    before = results(again)
    (again / "users.csv").write_text(CSV.replace("FR", "BE"))
    code, err = run(spec2, capsys, "--accept-table-change")
    assert code == 0, err
    after = results(again)
    assert all(r in after for r in before)
    assert {r["c"] for r in after if r["key"] == "u0"} == {"FR", "BE"}
    newest = sorted((again / "ckpt").glob("cp-*/MANIFEST.json"))[-1]
    assert json.loads(newest.read_text())["enrich"]["users"]["sha256"] != bound["sha256"]


def test_a_missing_table_file_is_a_spec_error(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = job(tmp_path, table=None)
    code, err = run(spec, capsys)
    assert code == 2
    assert one_line(err).endswith("enrich.users.path: "
                                  f"{tmp_path / 'users.csv'}: reference table not found")
    assert not (tmp_path / "out").exists() or results(tmp_path) == []


def test_duplicate_keys_at_one_version_are_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = job(tmp_path, table="user,country,since\nu0,FR,0\nu1,DE,0\nu0,BE,0\nu0,NL,5\n",
               enrich=ENRICH + 'valid_from = "since"\n')
    code, err = run(spec, capsys)
    assert code == 1
    assert one_line(err) == ("sealstream: error: enrich.users: the table holds 2 rows for "
                             "user='u0' valid_from=0 (rows 1, 3); a key has one row per "
                             "version")


def test_a_failing_query_is_a_spec_error(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with sqlite3.connect(tmp_path / "ref.db") as conn:
        conn.execute("CREATE TABLE users (user TEXT, country TEXT)")
    spec = job(tmp_path, table=None, enrich=(
        '[[enrich]]\nname = "users"\nkind = "sqlite"\nurl = "sqlite:///ref.db"\n'
        'query = "SELECT user, country FROM no_such_table"\non = "user"\n'))
    code, err = run(spec, capsys)
    assert code == 2
    assert one_line(err).endswith("enrich.users.query: the query fails: no such table: "
                                  "no_such_table")


def test_a_missing_column_names_the_columns_there_are(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = job(tmp_path, table="id,country\nu0,FR\n")
    code, err = run(spec, capsys)
    assert code == 1
    assert one_line(err) == ("sealstream: error: enrich.users: the table has no column "
                             "'user' (it has: id, country)")


@pytest.mark.parametrize(("extra", "message"), [
    ('on_missing = "skip"\n', "enrich.users.on_missing: 'skip' is not one of null, error, drop"),
    ('colour = "red"\n', "enrich.users.colour: unknown setting"),
    ('url = "sqlite:///x.db"\n', "enrich.users.url: not a setting of kind = 'csv'"),
])
def test_bad_settings_are_spec_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                      extra: str, message: str) -> None:
    spec = job(tmp_path, enrich=ENRICH + extra)
    code, err = run(spec, capsys)
    assert code == 2
    assert message in one_line(err)


def test_workers_are_refused_in_one_line(tmp_path: Path) -> None:
    from sealstream.errors import SpecError
    from sealstream.pipeline import with_workers

    spec = job(tmp_path)
    with pytest.raises(SpecError, match=r"^\[\[enrich\]\]: .*--workers is not supported "
                                        r"with \[\[enrich\]\] yet$"):
        Job(with_workers(load_spec(spec), 2))


def test_changed_tables_reads_any_recorded_shape() -> None:
    from sealstream.enrich import changed_tables

    now = {"users": {"sha256": "ab" * 32, "rows": 3}}
    assert changed_tables({"users": {"sha256": "ab" * 32}}, now) == []
    for recorded in (None, [], {"users": []}, {"users": {"sha256": 7}}, {}):
        assert len(changed_tables(recorded, now)) == 1
