"""What a new user meets in the first hour, through ``sealstream.cli.main``.

A run whose every record is bad fails (after committing) instead of exiting 0;
an aggregated field that never occurs is named on stderr; results on stdout are
never mixed with the summary; this run's counters and the job's totals are told
apart; messages say what is wrong (no "at at", a file is not a directory, an
unknown --pipeline); the freshness policy (--max-age) reaches the guard's STALE.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import sealstream
from sealstream.checkpoint.manifest import KEY_ENV
from sealstream.cli import main
from test_pipeline_spec import base_spec, write_spec

SRC = Path(sealstream.__file__).resolve().parents[1]  # the package under test


@pytest.fixture(autouse=True)
def _no_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(KEY_ENV, raising=False)
    monkeypatch.delenv("SEALSTREAM_CRASH_AT", raising=False)


def _inputs(d: Path, n: int = 150, *, field: str = "user", bad_every: int = 0) -> None:
    for p in ("in/p0.jsonl", "in/p1.jsonl"):
        path = d / p
        path.parent.mkdir(parents=True, exist_ok=True)
        lines = []
        for i in range(n):
            if bad_every and i % bad_every == bad_every - 1:
                lines.append('{"user": "a", "ts": "oops\n')
            else:
                lines.append(json.dumps({field: "ab"[i % 2], "ts": i * 1000, "amount": i}) + "\n")
        path.write_text("".join(lines), encoding="utf-8")


def _spec(d: Path, **changes: Any) -> Path:
    spec = base_spec()
    spec["checkpoint"]["every_events"] = 100
    for dotted, value in changes.items():
        sec, _, key = dotted.partition("__")
        if value is None:
            spec[sec].pop(key, None)
        else:
            spec.setdefault(sec, {})[key] = value
    return write_spec(d, spec)


def _lines(folder: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for f in sorted(folder.glob("part-*.jsonl"))
            for x in f.read_text(encoding="utf-8").splitlines()]


def _tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes()
            for p in sorted(folder.rglob("*")) if p.is_file() and "ckpt" not in p.parts}


def _json_out(capsys: pytest.CaptureFixture[str]) -> tuple[dict[str, Any], str]:
    out, err = capsys.readouterr()
    return json.loads(out), err


# ------------------------------------------------------------------ 15.2 all bad, unseen field


def test_a_run_where_every_record_is_bad_fails_after_committing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`key = "user"` but the input says "usr": 0 events, 300 bad records."""
    d = tmp_path / "job"
    _inputs(d, field="usr")
    spec = _spec(d)
    rc = main(["run", str(spec), "--quiet"])
    out, err = capsys.readouterr()
    assert rc == 1, err
    line = err.strip().splitlines()[-1]
    assert line.startswith("sealstream: error: 300 of 300 records were bad"), line
    assert "no record was good" in line and "source.key = 'user'" in line
    assert "--max-bad-ratio 1" in line and "committed" in line
    bad = _lines(d / "errors")
    assert len(bad) == 300 and {b["_reason"] for b in bad} == {"missing key field 'user'"}
    # a rerun reads nothing new, commits nothing, and reaches the same verdict
    before = _tree(d)
    assert main(["run", str(spec), "--quiet"]) == 1
    assert capsys.readouterr().err.strip().splitlines()[-1] == line
    assert _tree(d) == before
    # accepting it explicitly
    assert main(["run", str(spec), "--quiet", "--max-bad-ratio", "1"]) == 0
    assert _tree(d) == before


def test_the_bad_share_limit_comes_from_the_option_or_the_spec(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    d = tmp_path / "job"
    _inputs(d, bad_every=5)  # 20 % bad
    spec = _spec(d)
    assert main(["run", str(spec), "--quiet"]) == 0  # no limit by default
    assert "warning" not in capsys.readouterr().err  # and under the warning's half
    rc = main(["run", str(spec), "--quiet", "--max-bad-ratio", "0.1"])
    err = capsys.readouterr().err
    assert rc == 1 and "60 of 300 records were bad" in err and "20.0 %" in err, err
    assert "over the limit of 0.1" in err
    strict = _spec(d, pipeline__max_bad_ratio=0.1)
    assert main(["run", str(strict), "--quiet"]) == 1
    capsys.readouterr()
    assert main(["run", str(strict), "--quiet", "--max-bad-ratio", "0.25"]) == 0
    for wrong in (1.5, "half"):
        assert main(["run", str(_spec(d, pipeline__max_bad_ratio=wrong)), "--quiet"]) == 2
        err = capsys.readouterr().err
        assert "pipeline.max_bad_ratio" in err and len(err.splitlines()) == 1, err
    assert main(["run", str(spec), "--max-bad-ratio", "2"]) == 2
    assert "--max-bad-ratio" in capsys.readouterr().err


def test_more_than_half_bad_warns_without_a_limit_and_fails_with_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    d = tmp_path / "job"
    _inputs(d)
    for p in ("in/p0.jsonl", "in/p1.jsonl"):  # two of every three lines lack the key
        lines = (d / p).read_text(encoding="utf-8").splitlines(keepends=True)
        (d / p).write_text("".join(x if i % 3 == 0 else '{"ts": 1}\n'
                                   for i, x in enumerate(lines)), encoding="utf-8")
    spec = _spec(d)
    assert main(["run", str(spec), "--quiet"]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["sealstream: warning: 200 of 300 records were bad (each with its reason "
                   "in errors) (66.7 %); --max-bad-ratio R makes a share above R "
                   "fail the run"], err
    assert main(["run", str(spec), "--quiet", "--max-bad-ratio", "0.5"]) == 1
    err2 = capsys.readouterr().err
    assert "66.7 % is over the limit of 0.5" in err2 and "warning" not in err2, err2


def test_an_aggregated_field_that_never_occurs_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    d = tmp_path / "job"
    _inputs(d)
    spec = base_spec()
    spec["aggregates"] = {"n": "count", "total": "sum(amout)", "big": "max(amout)",
                          "avg": "mean(amount)"}
    path = write_spec(d, spec)
    assert main(["run", str(path), "--json"]) == 0
    summary, err = _json_out(capsys)
    assert summary["fields_never_seen"] == ["amout"]
    warnings = [x for x in err.splitlines() if x.startswith("sealstream: warning:")]
    assert warnings == [
        "sealstream: warning: field 'amout' appeared in none of this run's 300 good "
        "events, so total = sum(amout), big = max(amout) is null in every result; check "
        "the field name against the input"]
    assert {r["total"] for r in _lines(d / "out")} == {None}


# ------------------------------------------------------------------ 15.3 stdout stays JSON


@pytest.mark.parametrize("flags", [[], ["--json"]])
def test_results_on_stdout_are_the_only_thing_on_stdout(
    tmp_path: Path, flags: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    d = tmp_path / "job"
    _inputs(d, bad_every=50)
    spec = _spec(d, sink__path=None, sink__kind="stdout")
    assert main(["run", str(spec), *flags]) == 0
    out, err = capsys.readouterr()
    rows = [json.loads(x) for x in out.splitlines()]  # every line is JSON
    assert rows and all(set(r) == {"key", "window_start", "window_end", "n", "total", "avg"}
                        for r in rows)
    assert sum(r["n"] for r in rows) == 294
    if flags:
        assert json.loads(err[err.index("{\n"):])["this_run"]["results_written"] == len(rows)
    else:
        assert "results written" in err


# ------------------------------------------------------------------ 15.4 counters


def _crash_after_third_checkpoint_and_corrupt_it(d: Path, spec: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(SRC), SEALSTREAM_CRASH_AT="after_retention:3")
    res = subprocess.run([sys.executable, "-m", "sealstream", "run", str(spec), "--quiet"],
                         env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == -9, res.stderr
    state = sorted((d / "ckpt").glob("cp-*"))[-1] / "state.arrow"
    data = bytearray(state.read_bytes())
    data[len(data) // 2] ^= 0x20
    state.write_bytes(bytes(data))


def test_a_resumed_run_tells_this_run_from_the_job_total(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The demo's story: SIGKILL after checkpoint 3, checkpoint 3 damaged, resume from 2.
    What epoch 3 committed is found again and not repeated, counted per output."""
    d = tmp_path / "job"
    _inputs(d, n=400, bad_every=37)
    spec = base_spec()
    spec["checkpoint"]["every_events"] = 100
    spec["window"]["size_ms"] = 10_000
    spec["watermark"]["max_delay_ms"] = 0
    path = write_spec(d, spec)
    for p in ("in/p0.jsonl", "in/p1.jsonl"):  # a late event now and then
        lines = (d / p).read_text().splitlines(keepends=True)
        for i in range(60, len(lines), 25):
            lines[i] = json.dumps({"user": "a", "ts": 0, "amount": 1}) + "\n"
        (d / p).write_text("".join(lines))
    _crash_after_third_checkpoint_and_corrupt_it(d, path)

    def epoch3(sub: str) -> int:
        return sum(len(f.read_text().splitlines())
                   for f in (d / sub).glob("part-000000000003-*.jsonl"))

    again = {"results": epoch3("out"), "late_events": epoch3("late"),
             "bad_records": epoch3("errors")}
    assert again["results"] and again["late_events"] and again["bad_records"]
    assert main(["run", str(path), "--json"]) == 0
    s, _ = _json_out(capsys)
    run, total = s["this_run"], s["job_total"]
    assert s["resumed_from"] == 2
    assert run["already_committed"] == again
    results, late, bad = _lines(d / "out"), _lines(d / "late"), _lines(d / "errors")
    assert total["results_written"] == len(results)
    assert total["late_events"] == len(late) and total["bad_records"] == len(bad)
    assert total["events"] + total["bad_records"] == 800
    assert run["events"] < total["events"] and run["events"] > 0
    assert run["events_per_second"] == pytest.approx(run["events"] / s["seconds"], rel=1e-3)
    assert {k: s[k] for k in total} == total  # the flat figures are the job's
    # the human summary labels both columns, and the rerun of the finished job
    # shows no rate: it read nothing
    assert main(["run", str(path)]) == 0
    text = capsys.readouterr().out
    assert "this run  job total" in text and "per second" not in text
    assert ["results", "written", "0", f"{total['results_written']:,}"] in [
        x.split() for x in text.splitlines()]
    assert main(["run", str(path), "--json"]) == 0
    s2, _ = _json_out(capsys)
    assert s2["this_run"]["events"] == 0 and s2["this_run"]["events_per_second"] is None
    assert s2["job_total"] == total


# ------------------------------------------------------------------ 15.7 messages


def test_a_json_error_reads_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = tmp_path / "job"
    _inputs(d, bad_every=50)
    assert main(["run", str(_spec(d)), "--quiet"]) == 0
    reasons = {b["_reason"] for b in _lines(d / "errors")}
    assert reasons == {"invalid JSON: Unterminated string starting at column 21"}, reasons


def test_verify_on_a_file_says_it_is_not_a_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    f = tmp_path / "ckpt.db"
    f.write_bytes(b"")
    assert main(["checkpoints", "verify", str(f)]) == 2
    err = capsys.readouterr().err
    assert err == (f"sealstream: error: {f} is not a directory: give a checkpoint directory "
                   f"or a store URL; for a SQLite store give sqlite:///{f}\n")


def test_an_unknown_pipeline_is_named_with_the_ones_there(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    d = tmp_path / "job"
    _inputs(d)
    spec = _spec(d, checkpoint__path=None, checkpoint__url="sqlite:///ckpt.db")
    assert main(["run", str(spec), "--quiet"]) == 0
    url = f"sqlite:///{d / 'ckpt.db'}"
    for command in ("list", "verify", "inspect"):
        assert main(["checkpoints", command, url, "--pipeline", "nosuch"]) == 2
        out, err = capsys.readouterr()
        assert out == "" and err == (f"sealstream: error: --pipeline nosuch: no pipeline "
                                     f"'nosuch' in {url}; it holds 'payments'\n")
    assert main(["checkpoints", "verify", url, "--pipeline", "payments"]) == 0


def test_infinite_watermarks_have_one_spelling(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Summary, checkpoint log lines, list and verify: "+inf"/"-inf", never null.
    After the end of the input the watermark is the one the data reached (semantics
    section 10); a partition that ended before the others is at "+inf" meanwhile."""
    d = tmp_path / "job"
    _inputs(d)
    (d / "in/p1.jsonl").write_text("".join((d / "in/p1.jsonl").read_text()
                                           .splitlines(keepends=True)[:20]))
    spec = _spec(d)
    summary_file = tmp_path / "s.json"
    assert main(["run", str(spec), "--summary-json", str(summary_file), "--quiet"]) == 0
    capsys.readouterr()
    assert json.loads(summary_file.read_text())["watermark_ms"] == 18_000  # not batch-bound
    shutil_rmtree(d / "ckpt")
    assert main(["run", str(spec), "--start-over", "--json"]) == 0  # JSON log on stderr
    log = [json.loads(x) for x in capsys.readouterr().err.splitlines() if x.startswith("{")]
    first = [r for r in log if r["event"] == "checkpoint"][0]
    assert first["positions"][1]["watermark_ms"] == "+inf"  # p1 ended: W is p0's
    assert first["watermark_ms"] == first["positions"][0]["watermark_ms"] > 18_000
    assert log[-1]["event"] == "summary" and log[-1]["watermark_ms"] == 18_000
    assert main(["checkpoints", "list", str(d / "ckpt"), "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)["checkpoints"]
    assert listed[-1]["watermark_ms"] == 18_000
    for f in ("in/p0.jsonl", "in/p1.jsonl"):
        (d / f).write_text("")
    shutil_rmtree(d / "ckpt")
    assert main(["run", str(spec), "--start-over", "--summary-json", str(summary_file),
                 "--quiet"]) == 0
    assert json.loads(summary_file.read_text())["watermark_ms"] == "-inf"


def shutil_rmtree(path: Path) -> None:
    import shutil

    shutil.rmtree(path)


# ------------------------------------------------------------------ 15.8 list shows files


def test_list_shows_the_files_each_checkpoint_depends_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    d = tmp_path / "job"
    _inputs(d)
    assert main(["run", str(_spec(d)), "--quiet"]) == 0
    assert main(["checkpoints", "list", str(d / "ckpt"), "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)["checkpoints"]
    assert main(["checkpoints", "list", str(d / "ckpt")]) == 0
    table = capsys.readouterr().out
    for c in listed:
        assert c["files"]
        for f in c["files"]:
            assert f in table, f


# ------------------------------------------------------------------ 14: freshness, clock


def _wait_past(ms: int) -> None:
    """Until the wall clock is past ``ms`` (a condition, not a fixed sleep)."""
    while time.time() * 1000 <= ms:
        time.sleep(0.001)


def test_max_age_makes_old_checkpoints_stale_for_run_verify_and_replay(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    d = tmp_path / "job"
    _inputs(d)
    spec = _spec(d)
    assert main(["run", str(spec), "--quiet"]) == 0
    ckpt = d / "ckpt"
    created = max(json.loads((c / "MANIFEST.json").read_text())["created_ms"]
                  for c in ckpt.glob("cp-*"))
    _wait_past(created + 5)
    assert main(["checkpoints", "verify", str(ckpt), "--json", "--max-age", "0.001"]) == 1
    v = json.loads(capsys.readouterr().out)
    assert {c["reason"] for c in v["checkpoints"]} == {"STALE"} and v["resume_from"] is None
    assert main(["checkpoints", "verify", str(ckpt), "--json", "--max-age", "3600"]) == 0
    capsys.readouterr()
    before = _tree(d)
    assert main(["run", str(spec), "--max-age", "0.001"]) == 1
    err = capsys.readouterr().err
    assert "none is ATOMIC_CHECKPOINT" in err and "STALE" in err, err
    assert _tree(d) == before and sorted(p.name for p in ckpt.glob("cp-*"))  # nothing moved
    stale_spec = _spec(d, checkpoint__max_age_s=0.001)
    assert main(["run", str(stale_spec), "--quiet"]) == 1
    assert "STALE" in capsys.readouterr().err
    assert main(["checkpoints", "verify", str(ckpt), "--spec", str(stale_spec)]) == 1
    capsys.readouterr()
    assert main(["run", str(_spec(d, checkpoint__max_age_s=3600)), "--quiet"]) == 0
    rc = main(["replay", str(spec), "--from", "1", "--to", str(tmp_path / "r"),
               "--max-age", "0.001"])
    err = capsys.readouterr().err
    assert rc == 1 and "STALE" in err, err
    assert main(["run", str(_spec(d, checkpoint__max_age_s=0)), "--quiet"]) == 2
    assert "checkpoint.max_age_s" in capsys.readouterr().err


def test_inspect_says_when_a_checkpoint_was_written_in_the_future(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    d = tmp_path / "job"
    _inputs(d)
    spec = _spec(d)
    monkeypatch.setenv("COLUMNS", "200")  # rich: one table row per line
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + 3 * 3600)  # the clock, then set back
    assert main(["run", str(spec), "--quiet"]) == 0
    monkeypatch.setattr(time, "time", real)
    assert main(["checkpoints", "inspect", str(d / "ckpt")]) == 0
    out = capsys.readouterr().out
    assert "in the future (clock went back?)" in out and "written 2h 59m" in out, out
