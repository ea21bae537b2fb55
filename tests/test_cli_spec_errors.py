"""Spec and usage errors through ``sealstream.cli.main`` (semantics section 8).

Every error is exit code 2 and exactly one line on stderr,
``sealstream: error: ...``, naming the setting and its bad value (or the file
and line at fault). Never a traceback. These errors are all raised before any
input is read.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sealstream.checkpoint.manifest import KEY_ENV
from sealstream.cli import main
from test_pipeline_spec import BAD, bad_spec, base_spec, write_inputs, write_spec


@pytest.fixture(autouse=True)
def _no_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(KEY_ENV, raising=False)


@pytest.fixture
def job_dir(tmp_path: Path) -> Path:
    d = tmp_path / "job"
    write_inputs(d)
    return d


def one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    """The single line on stderr; asserts the error shape."""
    out, err = capsys.readouterr()
    assert "Traceback" not in err and "Traceback" not in out
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("sealstream: error: "), err
    return lines[0]


# ------------------------------------------------------------------ run: spec errors


def test_run_missing_spec(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["run", str(tmp_path / "missing.toml")])
    line = one_error_line(capsys)
    assert rc == 2
    assert "missing.toml" in line


@pytest.mark.parametrize("name", list(BAD))
def test_run_bad_spec(job_dir: Path, name: str, capsys: pytest.CaptureFixture[str]) -> None:
    spec = write_spec(job_dir, bad_spec(name))
    rc = main(["run", str(spec)])
    line = one_error_line(capsys)
    assert rc == 2, line
    assert "spec.toml" in line
    for needle in BAD[name][1]:
        assert needle in line, f"{needle!r} not in {line!r}"
    # nothing was created next to the spec
    assert sorted(p.name for p in job_dir.iterdir()) == ["in", "spec.toml"]


def test_run_invalid_toml(job_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = job_dir / "spec.toml"
    spec.write_text('[pipeline]\nname = "p"\n\n[window\nkind = "tumbling"\n', encoding="utf-8")
    rc = main(["run", str(spec)])
    line = one_error_line(capsys)
    assert rc == 2
    assert "spec.toml" in line and "line 4" in line


def test_run_missing_input_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = tmp_path / "job"
    write_inputs(d, ("in/p0.jsonl",))  # in/p1.jsonl is missing
    spec = write_spec(d, base_spec())
    rc = main(["run", str(spec)])
    line = one_error_line(capsys)
    assert rc == 2
    assert "source.paths" in line and "in/p1.jsonl" in line


def test_run_glob_matching_nothing(job_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = base_spec()
    spec["source"]["paths"] = ["in/*.csv"]
    rc = main(["run", str(write_spec(job_dir, spec))])
    line = one_error_line(capsys)
    assert rc == 2
    assert "source.paths" in line and "in/*.csv" in line


def test_run_input_that_is_not_a_regular_file(
    job_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (job_dir / "in" / "sub").mkdir()
    for paths, needles in (
        (["in/sub"], ["'in/sub'", "is a directory, not a file"]),
        (["/dev/null"], ["'/dev/null'", "not a regular file"]),
        (["in/*"], ["'in/*'", "matches 'in/sub'", "a directory"]),
    ):
        spec = base_spec()
        spec["source"]["paths"] = paths
        rc = main(["run", str(write_spec(job_dir, spec))])
        line = one_error_line(capsys)
        assert rc == 2 and "source.paths" in line, line
        for needle in needles:
            assert needle in line, (needle, line)


def test_run_the_same_file_spelled_twice(job_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Two spellings of one file would read it as two partitions: every count doubled."""
    (job_dir / "link.jsonl").symlink_to(job_dir / "in" / "p0.jsonl")
    same = "partition './in/p0.jsonl' and 'in/p0.jsonl' are the same file"
    for paths, needle in (
        (["in/p0.jsonl", "./in/p0.jsonl"], same),
        (["in/p0.jsonl", "in/../in/p0.jsonl"], "and 'in/p0.jsonl' are the same file"),
        (["in/p0.jsonl", "link.jsonl"], "'link.jsonl' and 'in/p0.jsonl' are the same file"),
        (["in/p0.jsonl", "in/*.jsonl"], "partition 'in/p0.jsonl' is listed twice"),
    ):
        spec = base_spec()
        spec["source"]["paths"] = paths
        rc = main(["run", str(write_spec(job_dir, spec))])
        line = one_error_line(capsys)
        assert rc == 2 and "source.paths" in line and needle in line, line
        assert not (job_dir / "out").exists()


@pytest.mark.parametrize("section", ["sink", "late", "errors", "checkpoint"])
def test_run_output_directory_that_is_a_file(
    job_dir: Path, section: str, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = base_spec()
    target = job_dir / spec[section]["path"]
    target.write_text("mine\n")
    rc = main(["run", str(write_spec(job_dir, spec))])
    line = one_error_line(capsys)
    assert rc == 2 and f"{section}.path" in line and "is a file, not a directory" in line
    assert target.read_text() == "mine\n"


def test_run_spec_that_is_not_utf8(job_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = write_spec(job_dir, base_spec())
    spec.write_bytes(spec.read_bytes().replace(b'"payments"', b'"pay\xffments"'))
    data = spec.read_bytes()
    at = data.index(b"\xff")
    nl = b"\n"
    want = f"line {data.count(nl, 0, at) + 1}, column {at - data.rfind(nl, 0, at)}"
    rc = main(["run", str(spec)])
    line = one_error_line(capsys)
    assert rc == 2 and "spec.toml" in line and want in line and "UTF-8" in line, line


def test_run_summary_json_into_a_missing_directory(
    job_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Checked before anything runs, as --metrics-file is."""
    spec = write_spec(job_dir, base_spec())
    rc = main(["run", str(spec), "--summary-json", str(job_dir / "nope" / "s.json")])
    line = one_error_line(capsys)
    assert rc == 2 and "--summary-json" in line and "nope" in line
    assert not (job_dir / "out").exists() and not (job_dir / "ckpt").exists()


def test_run_missing_input_is_relative_to_the_spec(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The inputs exist next to the current directory but not next to the spec."""
    write_inputs(tmp_path)
    spec = write_spec(tmp_path / "sub", base_spec())
    monkeypatch.chdir(tmp_path)
    rc = main(["run", str(spec.relative_to(tmp_path))])
    line = one_error_line(capsys)
    assert rc == 2 and "in/p0.jsonl" in line


def test_run_path_with_nul_character(job_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = job_dir / "spec.toml"
    text = write_spec(job_dir, base_spec()).read_text(encoding="utf-8")
    lines = text.splitlines()
    sink = lines.index("[sink]")
    path_line = next(i for i in range(sink, len(lines)) if lines[i].startswith('"path"'))
    lines[path_line] = 'path = "out\\u0000x"'
    spec.write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert "\\u0000" in spec.read_text(encoding="utf-8")
    rc = main(["run", str(spec)])
    line = one_error_line(capsys)
    assert rc == 2 and "sink.path" in line


def test_run_spec_is_a_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["run", str(tmp_path)])
    one_error_line(capsys)
    assert rc == 2


# ------------------------------------------------------------------ usage errors


@pytest.mark.parametrize(
    "argv",
    [
        ["frobnicate"],
        ["run"],
        ["run", "--bogus", "spec.toml"],
        ["run", "--batch-size", "0", "spec.toml"],
        ["run", "--batch-size", "many", "spec.toml"],
        ["checkpoints"],
        ["checkpoints", "frobnicate", "."],
        ["checkpoints", "list"],
        ["checkpoints", "verify", ".", "--bogus"],
        ["--bogus"],
    ],
    ids=lambda a: " ".join(a),
)
def test_usage_errors(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(argv)
    out, err = capsys.readouterr()
    assert rc == 2, (out, err)
    assert "Traceback" not in err
    if argv != ["checkpoints"]:  # a group without a command may print its help instead
        assert err.startswith("sealstream: error: ") and len(err.splitlines()) == 1, err


def test_help_and_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    assert "run" in capsys.readouterr().out
    assert main(["run", "--help"]) == 0
    assert "--start-over" in capsys.readouterr().out
    assert main(["--version"]) == 0
    assert "0.1.0" in capsys.readouterr().out


# ------------------------------------------------------------------ checkpoints list|verify


@pytest.mark.parametrize("command", ["list", "verify"])
def test_checkpoints_on_a_missing_directory(
    tmp_path: Path, command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nonexistent"
    rc = main(["checkpoints", command, str(missing), "--json"])
    out, err = capsys.readouterr()
    assert rc == 2
    assert out == ""
    assert err.startswith("sealstream: error: ") and len(err.splitlines()) == 1
    assert str(missing) in err


def test_checkpoints_verify_slash_nonexistent(capsys: pytest.CaptureFixture[str]) -> None:
    assert not Path("/nonexistent").exists()
    assert main(["checkpoints", "verify", "/nonexistent", "--json"]) == 2
    one_error_line(capsys)


def test_checkpoints_on_a_file_not_a_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    f = tmp_path / "file"
    f.write_text("x")
    assert main(["checkpoints", "verify", str(f), "--json"]) == 2
    one_error_line(capsys)


def test_checkpoints_list_empty(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["checkpoints", "list", str(tmp_path), "--json"])
    out, err = capsys.readouterr()
    assert rc == 0 and err == ""
    assert json.loads(out) == {"checkpoints": []}


def test_checkpoints_verify_empty(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["checkpoints", "verify", str(tmp_path), "--json"])
    out, err = capsys.readouterr()
    assert rc == 0 and err == ""
    data = json.loads(out)
    assert data["checkpoints"] == []
    assert data["resume_from"] is None


@pytest.mark.parametrize("command", ["list", "verify"])
def test_checkpoints_empty_human_output(
    tmp_path: Path, command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = main(["checkpoints", command, str(tmp_path)])
    out, err = capsys.readouterr()
    assert rc == 0 and "Traceback" not in out + err


def test_checkpoints_list_ignores_unrelated_entries(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "LOCK").write_text("")
    (tmp_path / "rejected").mkdir()
    (tmp_path / "notes.txt").write_text("hello")
    (tmp_path / "cp-abc").mkdir()
    assert main(["checkpoints", "list", str(tmp_path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"checkpoints": []}
    assert main(["checkpoints", "verify", str(tmp_path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["resume_from"] is None


def test_checkpoints_verify_with_a_bad_spec(
    job_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = write_spec(job_dir, bad_spec("window.size_ms zero"))
    rc = main(["checkpoints", "verify", str(tmp_path), "--json", "--spec", str(spec)])
    line = one_error_line(capsys)
    assert rc == 2 and "window.size_ms" in line


def test_checkpoints_verify_with_a_spec_whose_input_is_missing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    d = tmp_path / "job"
    d.mkdir()
    spec = write_spec(d, base_spec())
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    rc = main(["checkpoints", "verify", str(ckpt), "--json", "--spec", str(spec)])
    line = one_error_line(capsys)
    assert rc == 2 and "in/p0.jsonl" in line


def test_checkpoints_verify_with_a_good_spec_and_no_checkpoints(
    job_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = write_spec(job_dir, base_spec())
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    rc = main(["checkpoints", "verify", str(ckpt), "--json", "--spec", str(spec)])
    out, _ = capsys.readouterr()
    assert rc == 0
    assert json.loads(out)["resume_from"] is None


# ------------------------------------------------------------------ calibration: a good spec runs


def _small_job(directory: Path) -> Path:
    for name in ("in/p0.jsonl", "in/p1.jsonl"):
        path = directory / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(
            json.dumps({"user": "ab"[i % 2], "ts": i * 1000, "amount": i}) + "\n"
            for i in range(150)), encoding="utf-8")
    spec = base_spec()
    spec["checkpoint"]["every_events"] = 100
    return write_spec(directory, spec)


def test_the_base_spec_runs_and_its_checkpoints_verify(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The bad specs above differ from this one by one setting each."""
    spec = _small_job(tmp_path / "job")
    assert main(["run", str(spec), "--quiet"]) == 0
    capsys.readouterr()
    ckpt = tmp_path / "job" / "ckpt"
    assert main(["checkpoints", "verify", str(ckpt), "--json", "--spec", str(spec)]) == 0
    verified = json.loads(capsys.readouterr().out)
    ids = [c["id"] for c in verified["checkpoints"]]
    assert ids and all(c["verdict"] == "ATOMIC_CHECKPOINT" for c in verified["checkpoints"])
    assert verified["resume_from"] == ids[-1]
    assert main(["checkpoints", "list", str(ckpt), "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)["checkpoints"]
    assert [c["id"] for c in listed] == ids
    for c in listed:
        assert c["files"] == sorted(c["files"])
        assert all((ckpt / f).is_file() for f in c["files"])
        assert any(f.endswith("/MANIFEST.json") for f in c["files"])
    # the manifest carries what the guard reads (tests/checkpoint/test_guard.py builds the same)
    manifest = next(f for f in listed[-1]["files"] if f.endswith("/MANIFEST.json"))
    doc = json.loads((ckpt / manifest).read_text(encoding="utf-8"))
    assert set(doc) == {
        "format", "id", "parent", "pipeline", "fingerprint", "definition", "created_ms",
        "epoch", "lateness_ms", "watermark", "positions", "files", "state", "receipts",
        "sinks", "counters", "aggregate_order", "receipt_roots", "emission_log", "signature",
    }
    # the last checkpoint follows the end-of-input flush: closed_ms says what it closed
    assert set(doc["watermark"]) == {
        "global_ms", "partition_ms", "max_time", "exhausted", "max_delay_ms", "closed_ms"}


def test_verify_against_a_changed_spec_reports_the_fingerprint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = _small_job(tmp_path / "job")
    assert main(["run", str(spec), "--quiet"]) == 0
    changed = base_spec()
    changed["window"]["size_ms"] = 30000
    other = write_spec(tmp_path / "job", changed, name="changed.toml")
    capsys.readouterr()
    rc = main(["checkpoints", "verify", str(tmp_path / "job" / "ckpt"), "--json",
               "--spec", str(other)])
    data = json.loads(capsys.readouterr().out)
    assert rc == 1
    assert {c["reason"] for c in data["checkpoints"]} == {"FINGERPRINT_MISMATCH"}
    assert data["resume_from"] is None


def test_run_glob_that_would_read_its_own_results(
    job_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`*/*.jsonl` matches in/p0.jsonl, and also out/part-*.jsonl once results exist:
    a rerun would read its own output as input."""
    spec = base_spec()
    spec["source"]["paths"] = ["*/*.jsonl"]
    path = write_spec(job_dir, spec)
    assert main(["run", str(path), "--quiet"]) == 0  # no results yet: only the inputs
    capsys.readouterr()
    before = sorted(p.name for p in (job_dir / "out").iterdir())
    rc = main(["run", str(path)])
    line = one_error_line(capsys)
    assert rc == 2 and "source.paths[0]" in line and "narrow the pattern" in line, line
    assert sorted(p.name for p in (job_dir / "out").iterdir()) == before
