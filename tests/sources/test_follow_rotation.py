"""Followed files truncated or rotated while a live job runs (docs/live.md, "Rotation
and truncation").

A real ``sealstream run`` subprocess follows ``in/app.jsonl`` (``follow = true``,
``stop = "never"``) while the test truncates, renames and copy-truncates the file as
logrotate does. The test waits on committed output or the job's log lines, never on a
timer. A followed rotation is finished by a ``stop = "end"`` run, and the committed
output (out, late, errors) must equal a bounded run over what the files actually
held, one after the other, under the partition's name: every line read exactly once,
in order. Truncation and copy-truncation must stop the run at once with one line.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sealstream.testing.specs import files_source, spec_text, tumbling

SCENARIOS = Path(__file__).resolve().parents[1] / "scenarios"
if str(SCENARIOS) not in sys.path:
    sys.path.insert(0, str(SCENARIOS))

from _live_story import Log, committed, env, kill, run_quiet, start  # noqa: E402

APP = "in/app.jsonl"
#: how long a condition may take on a loaded machine before the test gives up
PATIENCE_S = 180.0


def lines(first: int, last: int, bad_at: int | None = None) -> str:
    """Events ``first..last-1`` (ts = 100 ms apart, three users); a bad line instead of
    event ``bad_at``."""
    out = []
    for i in range(first, last):
        out.append("{not json\n" if i == bad_at
                   else json.dumps({"user": f"u{i % 3}", "ts": i * 100}) + "\n")
    return "".join(out)


def spec(d: Path, paths: list[str], stop: str, follow: bool = True,
         name: str = "spec.toml", kind: str = "jsonl", every_ms: int | None = 50) -> str:
    source = files_source(paths, kind)
    if follow:
        source += f'\nfollow = true\npoll_ms = 20\nstop = "{stop}"'
    (d / name).write_text(spec_text(
        "rotation", source, batch_size=50, max_delay_ms=500, window=tumbling(1000),
        aggregates={"n": "count"}, late=True, errors=True, every_ms=every_ms, keep=2))
    return name


def setup(d: Path, paths: list[str], first: str, app: str = APP,
          kind: str = "jsonl") -> None:
    (d / "in").mkdir(parents=True)
    (d / app).write_text(first)
    spec(d, paths, "never", kind=kind)
    spec(d, paths, "end", name="end.toml", kind=kind)


def bounded(d: Path, content: str, app: str = APP, kind: str = "jsonl"
            ) -> dict[str, list[str]]:
    """The committed output of a bounded run over ``content`` as ``app``."""
    d.mkdir()
    (d / "in").mkdir()
    (d / app).write_text(content)
    spec(d, [app], "end", follow=False, kind=kind)
    run_quiet(d, timeout=PATIENCE_S)
    return committed(d)


def window_ends(d: Path) -> set[int]:
    ends: set[int] = set()
    for f in sorted((d / "out").glob("part-*.jsonl")):
        ends |= {json.loads(t)["window_end"] for t in f.read_text().splitlines()}
    return ends


def wait_window(d: Path, proc: subprocess.Popen[str], end: int) -> None:
    """Until the window ending at ``end`` is committed (the job read that far)."""
    deadline = time.monotonic() + PATIENCE_S
    while end not in window_ends(d):
        assert proc.poll() is None, f"the job ended (rc={proc.returncode})"
        assert time.monotonic() < deadline, f"window {end} never committed: {window_ends(d)}"
        time.sleep(0.1)


def exit_of(proc: subprocess.Popen[str], log: Log) -> tuple[int, list[str]]:
    """The job's exit code and its error lines, once it exits by itself."""
    try:
        proc.wait(timeout=PATIENCE_S)
    except subprocess.TimeoutExpired:
        kill(proc)
        raise AssertionError("the job did not stop: " + "".join(log.seen)) from None
    text = log.rest()
    return proc.returncode, [t for t in text.splitlines() if t.startswith("sealstream:")]


def stop(proc: subprocess.Popen[str], log: Log) -> None:
    proc.send_signal(signal.SIGTERM)
    rc, _ = exit_of(proc, log)
    assert rc == 0, "".join(log.seen)


def run_once(d: Path, spec_name: str) -> tuple[int, str]:
    r = subprocess.run([sys.executable, "-m", "sealstream", "run", spec_name, "--quiet"],
                       cwd=d, env=env(), capture_output=True, text=True,
                       timeout=PATIENCE_S, check=False)
    return r.returncode, r.stderr


def sums(out: dict[str, list[str]]) -> int:
    return sum(json.loads(t)["n"] for t in out["out"])


# ----------------------------------------------------------------- truncation
@pytest.mark.parametrize("cut", ["zero", "half"])
def test_a_followed_file_truncated_stops_the_run_at_once(tmp_path: Path, cut: str) -> None:
    d = tmp_path / "job"
    d.mkdir()
    setup(d, [APP], lines(0, 200))
    proc = start(d)
    log = Log(proc)
    wait_window(d, proc, 19_000)  # every line read (ts 19900 -> W 19400)
    before = committed(d)
    size = (d / APP).stat().st_size
    new_size = 0 if cut == "zero" else size // 2
    os.truncate(d / APP, new_size)
    rc, errors = exit_of(proc, log)
    assert rc == 1
    assert len(errors) == 1, errors
    assert "in/app.jsonl" in errors[0] and "was truncated" in errors[0]
    assert f"line offset 200 (byte {size})" in errors[0]
    assert f"now {new_size} bytes" in errors[0]
    after = committed(d)
    assert set(before["out"]) <= set(after["out"])  # nothing committed is lost
    assert len(set(after["out"])) == len(after["out"])
    assert sums(after) <= 200
    rc, err = run_once(d, "spec.toml")  # a restart refuses too
    assert rc == 1 and "in/app.jsonl" in err and "changed since its checkpoint" in err, err


@pytest.mark.parametrize("how", ["truncated", "written-again", "copy-in-glob"])
def test_copy_truncate_rotation_is_refused_naming_both_paths(tmp_path: Path,
                                                             how: str) -> None:
    """``cp app.jsonl app.jsonl.1; truncate -s0 app.jsonl``: refused when the truncation
    is seen (the writer may already have written past the old read position), or, when
    the copy matches the glob, as soon as discovery sees it (never read as a new
    partition, which would count its lines twice)."""
    d = tmp_path / "job"
    d.mkdir()
    setup(d, ["in/*.jsonl*"] if how == "copy-in-glob" else [APP], lines(0, 200))
    proc = start(d)
    log = Log(proc)
    wait_window(d, proc, 19_000)
    before = committed(d)
    shutil.copyfile(d / APP, d / "in" / "app.jsonl.1")
    if how != "copy-in-glob":
        with open(d / APP, "r+b") as f:
            f.truncate(0)
            if how == "written-again":  # the writer goes on past the read position at once
                f.write(lines(200, 500).encode())
    rc, errors = exit_of(proc, log)
    assert rc == 1
    assert len(errors) == 1, errors
    line = errors[0]
    if how == "copy-in-glob":
        assert "in/app.jsonl.1' appeared as a copy of its file" in line
        assert "in/app.jsonl' (it starts with" in line
    else:
        assert "copy-truncate rotation" in line and "line offset 200" in line
        assert "in/app.jsonl' copied to" in line and "in/app.jsonl.1'" in line
    assert "may be lost to everyone" in line and "create-mode rotation" in line
    after = committed(d)
    assert set(before["out"]) <= set(after["out"])
    assert sums(after) <= 200  # nothing read twice


# ----------------------------------------------------------------- rotation
@pytest.mark.parametrize("paths", [["in/*.jsonl*"], [APP]], ids=["glob-matches-rotated",
                                                                   "path"])
def test_a_rotation_is_followed_exactly_once(tmp_path: Path, paths: list[str]) -> None:
    d = tmp_path / "job"
    d.mkdir()
    a, b, c = lines(0, 200), lines(200, 250), lines(250, 280)
    new1, new2 = lines(280, 290, bad_at=283), lines(290, 300)
    setup(d, paths, a)
    proc = start(d)
    log = Log(proc)
    wait_window(d, proc, 19_000)
    with open(d / APP, "a") as f:
        f.write(b)  # maybe read before the rename, maybe after
    os.rename(d / APP, d / "in" / "app.jsonl.1")
    with open(d / "in" / "app.jsonl.1", "a") as f:
        f.write(c)  # the writer has not reopened yet
    # the new file: smaller than the old read position, a bad line in it
    (d / APP).write_text(new1)
    with open(d / APP, "a") as f:
        f.write(new2)
    wait_window(d, proc, 29_000)
    stop(proc, log)
    run_quiet(d, "end.toml", timeout=PATIENCE_S)
    got = committed(d)
    assert got == bounded(tmp_path / "ref", a + b + c + new1 + new2)
    assert sums(got) == 299 and len(got["errors"]) == 1


def test_sigkill_at_every_moment_of_a_rotation_resumes_exactly_once(tmp_path: Path) -> None:
    """Killed while the file is renamed with no new one yet (the restart finds it by
    its identity), while the renamed file's long tail is read, and after the new file
    began; each restart resumes where the checkpoint's identity says."""
    d = tmp_path / "job"
    d.mkdir()
    a, tail, new = lines(0, 100), lines(100, 2100), lines(2100, 2150)
    setup(d, ["in/*.jsonl*"], a)
    proc = start(d)
    log = Log(proc)
    wait_window(d, proc, 9_000)
    os.rename(d / APP, d / "in" / "app.jsonl.1")
    log.checkpoints(1)
    kill(proc)  # renamed, no new file: the partition's path is missing at the restart
    proc = start(d)
    log = Log(proc)
    log.checkpoints(1)
    with open(d / "in" / "app.jsonl.1", "a") as f:
        f.write(tail)
    (d / APP).write_text(new)
    log.checkpoints(2)
    kill(proc)  # mostly while the renamed file's tail is read (50 lines a step)
    for k in (2, 3):
        proc = start(d)
        log = Log(proc)
        log.checkpoints(k)
        kill(proc)
    run_quiet(d, "end.toml", timeout=PATIENCE_S)
    got = committed(d)
    assert got == bounded(tmp_path / "ref", a + tail + new)
    assert sums(got) == 2150


@pytest.mark.parametrize("deleted", [False, True])
def test_a_rotation_while_stopped(tmp_path: Path, deleted: bool) -> None:
    """Rotated while the job was stopped: the saved position's file is found under its
    new name and read to its end first; deleted, its unread tail is refused as expired
    data (exit 1, one line), never skipped."""
    d = tmp_path / "job"
    d.mkdir()
    a, b, new = lines(0, 100), lines(100, 150), lines(150, 170)
    setup(d, ["in/*.jsonl*"], a)
    proc = start(d)
    log = Log(proc)
    wait_window(d, proc, 9_000)
    stop(proc, log)
    with open(d / APP, "a") as f:
        f.write(b)
    os.rename(d / APP, d / "in" / "app.jsonl.1")
    (d / APP).write_text(new)
    if deleted:
        (d / "in" / "app.jsonl.1").unlink()
        rc, err = run_once(d, "end.toml")
        assert rc == 1, err
        msgs = [t for t in err.splitlines() if t.startswith("sealstream:")]
        assert len(msgs) == 1, err
        assert re.search(r"partition 'in/app.jsonl': the saved position 100 \(byte \d+\) "
                         r"belongs to a file .* rotated away .* is gone", msgs[0]), msgs[0]
        assert "--start-over" in msgs[0]
        return
    run_quiet(d, "end.toml", timeout=PATIENCE_S)
    got = committed(d)
    assert got == bounded(tmp_path / "ref", a + b + new)
    assert sums(got) == 170


def test_the_renamed_file_growing_after_the_switch_is_refused(tmp_path: Path) -> None:
    """A writer that goes on writing to the renamed file after the new one began:
    those lines could not be read in order; the run stops naming the renamed file."""
    d = tmp_path / "job"
    d.mkdir()
    setup(d, ["in/*.jsonl*"], lines(0, 100))
    proc = start(d)
    log = Log(proc)
    wait_window(d, proc, 9_000)
    os.rename(d / APP, d / "in" / "app.jsonl.1")
    (d / APP).write_text(lines(100, 150))
    wait_window(d, proc, 14_000)  # the partition has moved on to the new file
    with open(d / "in" / "app.jsonl.1", "a") as f:
        f.write(lines(150, 160))
    rc, errors = exit_of(proc, log)
    assert rc == 1 and len(errors) == 1, errors
    assert "in/app.jsonl.1', the file rotated away from" in errors[0]
    assert "grew after the partition moved on to the new file at position 100" in errors[0]
    assert sums(committed(d)) <= 150


def test_a_csv_rotation_is_followed_exactly_once(tmp_path: Path) -> None:
    """CSV: the new file's header is its own; its rows go on after the renamed
    file's, as the rows of one file holding both (one header) would."""
    d = tmp_path / "job"
    d.mkdir()

    def rows(first: int, last: int) -> str:
        return "".join(f"u{i % 3},{i * 100}\n" for i in range(first, last))

    app = "in/app.csv"
    header = "user,ts\n"
    setup(d, ["in/*.csv*"], header + rows(0, 100), app=app, kind="csv")
    proc = start(d)
    log = Log(proc)
    wait_window(d, proc, 9_000)
    with open(d / app, "a") as f:
        f.write(rows(100, 120))
    os.rename(d / app, d / "in" / "app.csv.1")
    (d / app).write_text(header + rows(120, 150))
    wait_window(d, proc, 14_000)
    stop(proc, log)
    run_quiet(d, "end.toml", timeout=PATIENCE_S)
    got = committed(d)
    assert got == bounded(tmp_path / "ref", header + rows(0, 150), app=app, kind="csv")
    assert sums(got) == 150


def read_to(d: Path, proc: subprocess.Popen[str], position: int) -> None:
    """Until a recorded step plan (``SEALSTREAM_KEEP_PLANS``) reads in/app.jsonl up to
    ``position``: plans are durable before their step's output, checkpoints or not."""
    deadline = time.monotonic() + PATIENCE_S
    while True:
        for f in sorted((d / "ckpt" / "plans").glob("step-*.json")):
            rng = json.loads(f.read_text())["ranges"].get(APP)
            if rng is not None and rng[1] >= position:
                return
        assert proc.poll() is None, f"the job ended (rc={proc.returncode})"
        assert time.monotonic() < deadline, f"{APP} never read up to {position}"
        time.sleep(0.1)


def test_a_rotation_before_the_first_checkpoint_replays_the_recorded_file(
        tmp_path: Path) -> None:
    """No checkpoint yet (no cadence): a crash after a rotation replays the recorded
    steps from the beginning. The step plan that first lists the partition records its
    file's identity, so the replay reads the renamed file, not the new file now at the
    path, and the renamed file is not taken as a new partition."""
    d = tmp_path / "job"
    d.mkdir()
    a, b, new = lines(0, 100), lines(100, 130), lines(130, 150)
    (d / "in").mkdir()
    (d / APP).write_text(a)
    spec(d, ["in/*.jsonl*"], "never", every_ms=None)
    spec(d, ["in/*.jsonl*"], "end", name="end.toml", every_ms=None)
    proc = start(d)
    Log(proc)
    read_to(d, proc, 100)
    os.rename(d / APP, d / "in" / "app.jsonl.1")
    with open(d / "in" / "app.jsonl.1", "a") as f:
        f.write(b)
    (d / APP).write_text(new)
    read_to(d, proc, 150)
    kill(proc)
    assert not list((d / "ckpt").glob("cp-*"))  # nothing but plans to recover from
    run_quiet(d, "end.toml", timeout=PATIENCE_S)
    got = committed(d)
    assert got == bounded(tmp_path / "ref", a + b + new)
    assert sums(got) == 150
