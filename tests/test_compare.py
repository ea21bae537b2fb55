"""`sealstream compare A B`: real outputs of real runs (JSON Lines, Parquet, SQLite,
PostgreSQL, a replay beside the live run), edited copies that differ, and bad input."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from scenarios._story import AGGREGATES, make_input, run
from sealstream.cli import main
from sealstream.testing.specs import files_source, spec_text

SQLITE_SINK = 'kind = "sqlite"\nurl = "sqlite:///results.db"\ntable = "results"'


def _job(d: Path, names: list[str], sink: str, *, key: str | None = "user",
         source_extra: str = "", batch_size: int = 50,
         aggregates: dict[str, str] = AGGREGATES) -> Path:
    """Run the story's pipeline from ``d``'s input into ``sink``; return ``d``."""
    spec = d / "spec.toml"
    spec.write_text(spec_text("cmp", files_source(names) + source_extra, key=key,
                              batch_size=batch_size,
                              window='kind = "tumbling"\nsize_ms = 2000',
                              aggregates=aggregates, sink=sink, late=True,
                              every_events=150, keep=50))
    res = run(spec)
    assert res.returncode == 0, res.stderr
    return d


@pytest.fixture(scope="module")
def outputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One input, run into a JSON Lines, a Parquet and a SQLite output."""
    base = tmp_path_factory.mktemp("outputs")
    names = [str(base / n) for n in make_input(base, events=300)]
    out = {}
    for kind, sink in (("jsonl", 'kind = "jsonl"\npath = "out"'),
                       ("parquet", 'kind = "parquet"\npath = "out"'),
                       ("sqlite", SQLITE_SINK)):
        d = base / kind
        d.mkdir()
        out[kind] = _job(d, names, sink)
    out["input"] = base
    return out


def compare(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["compare", *args])
    got = capsys.readouterr()
    return code, got.out, got.err


def report(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, Any]]:
    code, out, err = compare(capsys, *args, "--json")
    assert not err, err
    return code, json.loads(out)


def _lines(d: Path) -> list[tuple[Path, list[str]]]:
    return [(f, f.read_text().splitlines()) for f in sorted(d.glob("part-*.jsonl"))]


def test_the_same_run_in_every_file_and_sqlite_output_is_equal(
        outputs: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    jsonl, parquet = outputs["jsonl"] / "out", outputs["parquet"] / "out"
    db = str(outputs["sqlite"] / "results.db")
    total = sum(len(lines) for _, lines in _lines(jsonl))
    assert total > 50
    for a, b, extra in ((jsonl, parquet, []), (parquet, db, ["--table-b", "results"]),
                        (db, jsonl, ["--table-a", "results"])):
        code, rep = report(capsys, str(a), str(b), *extra)
        assert code == 0, rep
        assert rep["equal"] is True
        assert rep["a"]["windows"] == rep["b"]["windows"] == total
        assert rep["only_in_a"] == {"count": 0, "windows": []}
        assert rep["differing"]["values"] == 0
    code, out, _ = compare(capsys, str(jsonl), str(parquet))
    assert code == 0 and out.splitlines()[-1].startswith("equal (within rel-tol 1e-09")


def test_a_replay_compares_equal_with_the_live_output(
        outputs: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    import subprocess
    import sys

    live = outputs["jsonl"]
    dest = live.parent / "replay-all"
    res = subprocess.run([sys.executable, "-m", "sealstream", "replay", str(live / "spec.toml"),
                          "--from", "start", "--to", str(dest), "--quiet"],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    code, out, err = compare(capsys, str(live / "out"), str(dest / "out"))
    assert (code, err) == (0, ""), out


def _edited(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def test_an_edited_copy_reports_each_window_and_value_and_exits_1(
        outputs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    live = outputs["jsonl"] / "out"
    copy = _edited(live, tmp_path / "copy")
    (f0, lines0), (f1, lines1) = _lines(copy)[0], _lines(copy)[-1]
    dropped = json.loads(lines0[0])
    changed = json.loads(lines1[-1])
    extra = dict(changed, window_start=changed["window_start"] + 10**9,
                 window_end=changed["window_end"] + 10**9)
    changed["n"] += 1
    f0.write_text("\n".join(lines0[1:]) + "\n")
    f1.write_text("\n".join([*lines1[:-1], json.dumps(changed), json.dumps(extra)]) + "\n")
    code, rep = report(capsys, str(live), str(copy))
    assert code == 1 and rep["equal"] is False
    key = dropped["key"]
    assert rep["only_in_a"] == {"count": 1, "windows": [
        {"key": key, "window_start": dropped["window_start"],
         "window_end": dropped["window_end"]}]}
    assert rep["only_in_b"]["count"] == 1
    assert rep["only_in_b"]["windows"][0]["window_start"] == extra["window_start"]
    assert rep["differing"] == {"windows": 1, "values": 1, "rows": [
        {"key": changed["key"], "window_start": changed["window_start"],
         "window_end": changed["window_end"], "field": "n", "a": changed["n"] - 1,
         "b": changed["n"]}]}
    code, out, _ = compare(capsys, str(live), str(copy))
    assert code == 1
    assert "only in A: 1 windows" in out and "differing: 1 windows, 1 values" in out
    assert f"n: A {changed['n'] - 1}, B {changed['n']}" in out
    assert out.splitlines()[-1].startswith("different")


def _with_float_noise(src: Path, dst: Path, factor: float) -> tuple[Path, float]:
    """A copy of ``src`` whose first float ``total`` is multiplied by ``factor``."""
    copy = _edited(src, dst)
    for f, lines in _lines(copy):
        for n, line in enumerate(lines):
            row = json.loads(line)
            if isinstance(row["total"], float) and row["total"] != 0:
                old = row["total"]
                row["total"] = old * factor
                assert row["total"] != old
                lines[n] = json.dumps(row)
                f.write_text("\n".join(lines) + "\n")
                return copy, old
    raise AssertionError("no float total in the output")


def test_floats_compare_within_the_tolerance_integers_exactly(
        outputs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    live = outputs["jsonl"] / "out"
    noisy, _ = _with_float_noise(live, tmp_path / "noisy", 1 + 1e-12)
    assert compare(capsys, str(live), str(noisy))[0] == 0
    code, rep = report(capsys, str(live), str(noisy), "--rel-tol", "0")
    assert code == 1 and [r["field"] for r in rep["differing"]["rows"]] == ["total"]
    far, old = _with_float_noise(live, tmp_path / "far", 1.01)
    assert compare(capsys, str(live), str(far))[0] == 1
    assert compare(capsys, str(live), str(far), "--rel-tol", "0.02")[0] == 0
    assert compare(capsys, str(live), str(far), "--rel-tol", "0",
                   "--abs-tol", str(abs(old) * 0.011))[0] == 0
    # an integer count off by one differs whatever the tolerance
    copy = _edited(live, tmp_path / "count")
    f, lines = _lines(copy)[0]
    row = json.loads(lines[0])
    row["n"] += 1
    f.write_text("\n".join([json.dumps(row), *lines[1:]]) + "\n")
    code, rep = report(capsys, str(live), str(copy), "--rel-tol", "0.9")
    assert code == 1 and rep["differing"]["rows"][0]["field"] == "n"


def test_a_postgresql_table_compares_with_a_file_output(
        outputs: dict[str, Path], pg_url: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    import psycopg

    names = sorted(str(p) for p in (outputs["input"] / "in").glob("*.jsonl"))
    sink = f'kind = "postgresql"\nurl = "{pg_url}"\ntable = "results"'
    _job(tmp_path, names, sink)
    jsonl = str(outputs["jsonl"] / "out")
    code, rep = report(capsys, pg_url, jsonl, "--table-a", "results")
    assert code == 0, rep
    with psycopg.connect(pg_url, autocommit=True) as conn:
        row = conn.execute("SELECT key, window_start, n FROM results ORDER BY key, "
                           "window_start LIMIT 1").fetchone()
        assert row is not None
        conn.execute("UPDATE results SET n = n + 5 WHERE key = %s AND window_start = %s",
                     (row[0], row[1]))
    code, rep = report(capsys, jsonl, pg_url, "--table-b", "results")
    assert code == 1
    assert [(r["field"], r["a"], r["b"]) for r in rep["differing"]["rows"]] == [
        ("n", row[2], row[2] + 5)]


def test_compound_keys_compare_and_a_different_key_shape_is_bad_input(
        outputs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    names = sorted(str(p) for p in (outputs["input"] / "in").glob("*.jsonl"))
    compound = '\nkey = ["user", "i"]'
    aggregates = {k: v for k, v in AGGREGATES.items() if v != "first(i)"}
    (tmp_path / "j").mkdir()
    (tmp_path / "p").mkdir()
    (tmp_path / "s").mkdir()
    j = _job(tmp_path / "j", names, 'kind = "jsonl"\npath = "out"', key=None,
             source_extra=compound, aggregates=aggregates)
    p = _job(tmp_path / "p", names, 'kind = "parquet"\npath = "out"', key=None,
             source_extra=compound, batch_size=7, aggregates=aggregates)
    code, rep = report(capsys, str(j / "out"), str(p / "out"))
    assert code == 0 and rep["a"]["windows"] > 300
    j_single = _job(tmp_path / "s", names, 'kind = "jsonl"\npath = "out"',
                    aggregates=aggregates)
    code, out, err = compare(capsys, str(j / "out"), str(j_single / "out"))
    assert code == 2 and not out
    assert err.strip().count("\n") == 0
    assert "different key shapes" in err and "the key (user, i)" in err


def test_bad_input_is_one_line_and_exit_2(
        outputs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    jsonl = str(outputs["jsonl"] / "out")
    db = str(outputs["sqlite"] / "results.db")
    (tmp_path / "empty").mkdir()
    (tmp_path / "notes.jsonl").write_text('{"hello": 1}\n')
    cases = [
        ([str(tmp_path / "nowhere"), jsonl], "no such file or directory"),
        ([jsonl, str(tmp_path / "empty")], "no committed results"),
        ([str(outputs["jsonl"] / "late"), jsonl], "window"),
        ([str(tmp_path / "notes.jsonl"), jsonl], "not results"),
        ([db, jsonl], "needs a table"),
        ([db, jsonl, "--table-a", "nothing"], "no such table"),
        ([jsonl, jsonl, "--table", "results"], "not a SQLite file"),
    ]
    for args, words in cases:
        code, out, err = compare(capsys, *args)
        assert code == 2, (args, out, err)
        assert err.startswith("sealstream: error: ") and err.count("\n") == 1, err
        assert words in err, (args, err)
        assert not out
    assert not (tmp_path / "nowhere").exists()
