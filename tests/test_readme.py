"""The README's examples run as written."""

from __future__ import annotations

import json
import re
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

from sealstream.testing.datagen import generate

README = Path(__file__).resolve().parents[1] / "README.md"


def _block(title: str, lang: str) -> str:
    text = README.read_text(encoding="utf-8")
    # the first block of that language in the section
    m = re.search(rf"## {re.escape(title)}\n(?:(?!\n## ).)*?```{lang}\n(.*?)```", text, re.S)
    assert m, f"README has no {lang} block under '## {title}'"
    return m.group(1)


def _inputs_with_a_bad_line(tmp_path: Path) -> None:
    """The snippet's two input files, the first with a malformed third line."""
    generate(tmp_path / "in", events=5_000, keys=10, partitions=2)
    p0 = tmp_path / "in" / "p0.jsonl"
    lines = p0.read_text().splitlines(keepends=True)
    p0.write_text("".join(lines[:2]) + "not json\n" + "".join(lines[2:]))


def _jsonl(directory: Path) -> list[dict[str, object]]:
    return [json.loads(x) for f in sorted(directory.glob("*.jsonl"))
            for x in f.read_text().splitlines()]


def test_python_example_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                             capsys: pytest.CaptureFixture[str]) -> None:
    """The snippet as shown, on input with a bad line: it runs to the end, the bad
    line is in errors/ and every good event is counted once."""
    _inputs_with_a_bad_line(tmp_path)
    (tmp_path / "example.py").write_text(_block("The same in Python", "python"))
    monkeypatch.chdir(tmp_path)
    runpy.run_path(str(tmp_path / "example.py"), run_name="__main__")
    results = _jsonl(tmp_path / "out")
    late = _jsonl(tmp_path / "late")
    assert results and sum(int(str(r["n"])) for r in results) + len(late) == 5_000
    bad = _jsonl(tmp_path / "errors")
    assert [(b["_partition"], b["_line"], b["_raw"]) for b in bad] == [
        ("in/p0.jsonl", 3, "not json")]
    assert capsys.readouterr().out == "5000 events, 1 bad records, "\
        f"{len(results)} windows\n"


@pytest.mark.parametrize("case", ["no errors output", "missing input"])
def test_python_example_fails_in_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                          case: str) -> None:
    """The snippet's error handling: without ``errors=`` the bad line, and a missing
    input file, end the script with one line naming the file (no traceback)."""
    _inputs_with_a_bad_line(tmp_path)
    code = _block("The same in Python", "python")
    if case == "no errors output":
        code, n = re.subn(r"\n *errors=ss\.Output\(.*\n", "\n", code)
        assert n == 1
        expected = "sealstream: error: in/p0.jsonl: line 3: invalid JSON"
    else:
        (tmp_path / "in" / "p1.jsonl").unlink()
        expected = "sealstream: error: source.paths: input file 'in/p1.jsonl' does not exist"
    (tmp_path / "example.py").write_text(code)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exc:
        runpy.run_path(str(tmp_path / "example.py"), run_name="__main__")
    message = exc.value.code
    assert isinstance(message, str) and "\n" not in message
    assert message.startswith(expected), message


def test_spec_example_runs(tmp_path: Path) -> None:
    generate(tmp_path / "in", events=5_000, keys=10, partitions=2)
    spec = tmp_path / "payments.toml"
    spec.write_text(_block("A pipeline in a spec file", "toml"))
    res = subprocess.run([sys.executable, "-m", "sealstream", "run", str(spec), "--json"],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    summary = json.loads(res.stdout)
    assert summary["events"] == 5_000 and summary["checkpoints"]["count"] >= 1


def test_database_example_runs(tmp_path: Path, pg_url: str) -> None:
    """The database section's sink and checkpoint, in the spec example, against a real
    PostgreSQL server: the table holds every window once."""
    import psycopg

    generate(tmp_path / "in", events=5_000, keys=10, partitions=2)
    base = _block("A pipeline in a spec file", "toml")
    db = _block("Checkpoints and results in a database", "toml")
    db = db.replace("postgresql://app@db.internal/analytics", pg_url)
    kept = re.split(r"\n(?=\[)", base)
    kept = [sec for sec in kept if not sec.startswith(("[sink]", "[checkpoint]"))]
    spec = tmp_path / "payments.toml"
    spec.write_text("\n".join(kept) + "\n" + db)
    res = subprocess.run([sys.executable, "-m", "sealstream", "run", str(spec), "--json"],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    with psycopg.connect(pg_url) as conn:
        n, windows, distinct = conn.execute(
            "SELECT sum(n), count(*), count(DISTINCT (key, window_start)) FROM page_views"
        ).fetchone()  # type: ignore[misc]
    late = sum(len(f.read_text().splitlines()) for f in (tmp_path / "late").glob("*.jsonl"))
    assert n + late == 5_000 and windows == distinct > 0
    listed = subprocess.run([sys.executable, "-m", "sealstream", "checkpoints", "verify",
                             pg_url, "--json"], capture_output=True, text=True, timeout=60)
    assert listed.returncode == 0, listed.stderr
    assert json.loads(listed.stdout)["resume_from"] is not None
