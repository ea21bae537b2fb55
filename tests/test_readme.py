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


def test_spec_walkthrough_runs(tmp_path: Path) -> None:
    """The spec section's shell lines as a new user types them, in a directory holding
    only the spec: sample input with bad lines is written, and the run diverts them to
    errors/ and counts every good event once."""
    import shlex

    (tmp_path / "payments.toml").write_text(_block("A pipeline in a spec file", "toml"))
    lines = [x for x in _block("A pipeline in a spec file", "sh").splitlines() if x.strip()]
    assert lines[-1] == "sealstream run payments.toml"
    for line in lines:
        argv = shlex.split(line.split("#")[0])
        argv = ([sys.executable, "-m", "sealstream", *argv[1:]] if argv[0] == "sealstream"
                else [sys.executable, *argv[1:]] if argv[0] == "python" else argv)
        res = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=300)
        assert res.returncode == 0, (line, res.stderr)
    records = sum(len(f.read_text().splitlines()) for f in (tmp_path / "in").glob("*.jsonl"))
    bad = _jsonl(tmp_path / "errors")
    n = sum(int(str(r["n"])) for r in _jsonl(tmp_path / "out"))
    assert bad and {b["_partition"] for b in bad} <= {"in/p0.jsonl", "in/p1.jsonl"}
    assert n + len(_jsonl(tmp_path / "late")) + len(bad) == records


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


ROOT = README.parent
DOCS = [README, *sorted((ROOT / "docs").glob("*.md")), ROOT / "examples" / "README.md",
        ROOT / "bench" / "README.md"]


def _anchors(md: Path) -> set[str]:
    """GitHub's anchors of a Markdown file's headings."""
    out = set()
    for line in re.sub(r"```.*?```", "", md.read_text(encoding="utf-8"), flags=re.S).splitlines():
        m = re.match(r"#+ (.*)", line)
        if m:
            out.add(re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-"))
    return out


@pytest.mark.parametrize("md", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_doc_links_stay_in_the_repository(md: Path) -> None:
    """A clone holds everything its docs link to: every relative link of the README and
    docs names a file inside the repository (and a heading of it, with #anchor)."""
    text = re.sub(r"```.*?```", "", md.read_text(encoding="utf-8"), flags=re.S)
    links = re.findall(r"\]\(([^)\s]+)\)", text)
    assert "shared/spec" not in text
    problems = []
    for link in links:
        if link.startswith(("http://", "https://", "mailto:")):
            continue
        path, _, anchor = link.partition("#")
        target = (md.parent / path).resolve() if path else md
        if not target.is_relative_to(ROOT.resolve()) or not target.exists():
            problems.append(f"{link}: not a file of the repository")
        elif anchor and target.suffix == ".md" and anchor not in _anchors(target):
            problems.append(f"{link}: {target.name} has no heading #{anchor}")
    assert not problems, problems
