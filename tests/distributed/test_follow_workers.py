"""Followed files (``follow = true``) on the data plane: each file is opened and
followed by the worker that owns its partition (the single-process rotation and
truncation detection, the same one-line errors), the coordinator plans and records
the steps from the owners' reports, and the outputs are staged by the workers.

The output with workers equals one process's (the same recorded plan), through a
SIGKILLed worker and a rotation; the coordinator receives the same few hundred bytes
per step whatever the step's events (no event or output row crosses it)."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

SCENARIOS = Path(__file__).resolve().parents[1] / "scenarios"
SOURCES = Path(__file__).resolve().parents[1] / "sources"
for extra in (SCENARIOS, SOURCES):
    if str(extra) not in sys.path:
        sys.path.append(str(extra))

from _live_story import Log, committed, copy_plans, env, run_quiet  # noqa: E402
from _story import assert_same_output, make_input, run, write_spec  # noqa: E402

EVENTS = 500
SPEC = {"every_events": 150, "batch_size": 40, "errors": True}


def _follow(spec: Path, stop: str, paths: list[str] | None = None) -> Path:
    """``spec`` (a :func:`write_spec` one) following its files until ``stop``."""
    text = spec.read_text()
    if paths is not None:
        start = text.index("paths = [")
        text = text[:start] + "paths = " + json.dumps(paths) + text[text.index("\n", start):]
    spec.write_text(text.replace('time = "ts"\n',
                                 f'time = "ts"\nfollow = true\npoll_ms = 20\nstop = "{stop}"\n',
                                 1))
    return spec


def _job(spec: Path, workers: int, **kw: Any) -> Any:
    from sealstream import load_spec
    from sealstream.distributed import DistributedJob

    return DistributedJob(load_spec(spec), workers=workers, **kw)


def _staged_by(d: Path, role: str) -> set[str]:
    """Which stagers wrote the committed files of ``role``: "w0", "w1", ... (a
    worker), "coordinator"."""
    out = set()
    for f in (d / role).glob("part-*.jsonl"):
        stem = f.name.split(".")[0]
        tail = stem.rsplit("w", 1)
        out.add(f"w{tail[1]}" if len(tail) == 2 and tail[1].isdigit() else "coordinator")
    return out


@pytest.fixture(scope="module")
def story(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Three followed files (late events, bad records, integer keys) read to their
    end (``stop = "end"``) by one process."""
    d = tmp_path_factory.mktemp("follow-ref")
    names = make_input(d, events=EVENTS, bad_every=97)
    spec = _follow(write_spec(d, names, **SPEC), "end")
    res = run(spec)
    assert res.returncode == 0, res.stderr
    return {"dir": d, "names": names}


def _copy(story: dict[str, Any], d: Path) -> Path:
    names = make_input(d, events=EVENTS, bad_every=97)
    assert names == story["names"]
    return _follow(write_spec(d, names, **SPEC), "end")


def test_followed_files_with_two_workers_equal_one_process(
        ray_cluster: Any, story: dict[str, Any], tmp_path: Path) -> None:
    """Each file followed by its owner worker: results, late events and bad records
    equal one process's; every output staged by the workers (files of both, none of
    the coordinator's), no output row received by the coordinator."""
    from sealstream.distributed._follow_read import FollowPlanner

    spec = _copy(story, tmp_path)
    job = _job(spec, 2)
    job.run()
    assert isinstance(job.merger, FollowPlanner)
    assert job.counters.events > 0 and job.counters.late_events > 0
    assert job.counters.bad_records > 0
    assert_same_output(tmp_path, story["dir"])
    for role in ("out", "late", "errors"):
        assert _staged_by(tmp_path, role) == {"w0", "w1"}, role
    assert not any(job.merger.output_bytes)
    # the checkpoint records each file's full position, as one process does
    manifest = json.loads(sorted((tmp_path / "ckpt").glob("cp-*/MANIFEST.json"))[-1]
                          .read_text())
    text = json.dumps(manifest)
    assert '"ino"' in text and '"byte_offset"' in text


class _KillWorker:
    """A progress hook that SIGKILLs one Ray worker process after a drawn step."""

    def __init__(self, rng: random.Random, steps: int) -> None:
        self.rng, self.at, self.step = rng, rng.randrange(2, steps), 0
        self.killed: list[int] = []

    def __call__(self, job: Any) -> None:
        self.step += 1
        if self.step >= self.at and not self.killed and job.worker_pids:
            pid = self.rng.choice(job.worker_pids)
            os.kill(pid, signal.SIGKILL)
            self.killed.append(pid)


def test_a_worker_sigkilled_mid_run_gives_one_process_output(
        ray_cluster: Any, story: dict[str, Any], tmp_path: Path) -> None:
    """A worker process SIGKILLed after a random step: every worker restarts from the
    newest checkpoint, reopens its files at the checkpoint's file positions and
    re-reads the recorded ranges; the output is one process's, exactly once."""
    spec = _copy(story, tmp_path)
    kill = _KillWorker(random.Random(5), steps=8)
    job = _job(spec, 2, progress=kill)
    job.run()
    assert kill.killed and job.restarts == 1
    assert_same_output(tmp_path, story["dir"])


def _lines(first: int, n: int, part: int) -> str:
    return "".join(json.dumps({"user": f"u{(i * 7 + part) % 13}", "ts": 100 * i + part,
                               "amount": i % 5, "i": i}) + "\n"
                   for i in range(first, first + n))


def test_growing_files_equal_one_process_replaying_the_recorded_plan(
        ray_cluster: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``stop = "never"`` with 2 workers while the files grow between steps (a bad
    line, late lines, a third file appearing mid-run), stopped; then resumed with 3
    workers after more lines, to the end (``stop = "end"``). The committed output
    equals ONE process replaying the recorded plan over the same files into a fresh
    store, line for line."""
    monkeypatch.setenv("SEALSTREAM_KEEP_PLANS", "1")
    d = tmp_path / "job"
    (d / "in").mkdir(parents=True)
    for part in range(2):
        (d / "in" / f"p{part}.jsonl").write_text(_lines(0, 60, part))
    names = ["in/p0.jsonl", "in/p1.jsonl"]
    never = _follow(write_spec(d, names, **SPEC), "never", ["in/*.jsonl"])
    end_text = never.read_text().replace('stop = "never"', 'stop = "end"')
    (d / "end.toml").write_text(end_text)

    class Grow:
        def __init__(self) -> None:
            self.calls, self.at = 0, 60

        def __call__(self, job: Any) -> None:
            self.calls += 1
            if self.calls % 3 == 0 and self.at < 400:
                for part in range(3 if self.at >= 200 else 2):
                    with (d / "in" / f"p{part}.jsonl").open("a") as f:
                        f.write(_lines(self.at, 20, part))
                        if self.at == 120:
                            f.write('{"user": "u1", "ts": "not-a-time"}\n')
                        if self.at == 160:  # late for any watermark that reached 15000
                            f.write(_lines(10, 2, part))
                self.at += 20
            elif self.at >= 400 and job.stop_requested is None:
                job.stop_requested = signal.SIGTERM
            if self.at == 200 and not (d / "in" / "p2.jsonl").exists():
                (d / "in" / "p2.jsonl").write_text(_lines(0, 200, 2))

    grow = Grow()
    job = _job(never, 2, progress=grow)
    job.run()
    assert grow.at >= 400 and job.counters.events > 0
    assert len(job.names) == 3
    for part in range(3):
        with (d / "in" / f"p{part}.jsonl").open("a") as f:
            f.write(_lines(400, 30, part))
    job = _job(d / "end.toml", 3)
    job.run()
    assert job.resumed_from is not None
    got = committed(d)
    assert got["out"] and got["late"] and got["errors"]

    ref = tmp_path / "ref"  # one process, the recorded plan, a fresh store
    copy_plans(d, ref)
    shutil.copytree(d / "in", ref / "in")
    (ref / "end.toml").write_text(end_text)
    run_quiet(ref, "end.toml", timeout=300)
    assert got == committed(ref)


def test_no_event_row_passes_through_the_coordinator(
        ray_cluster: Any, tmp_path: Path) -> None:
    """Steps of about 60 and of about 6,000 lines of followed files: what the
    coordinator receives per step (the owners' reports, the slabs' summaries with each
    file's position, the key workers' replies) is the same few hundred bytes."""
    window = 'kind = "tumbling"\nsize_ms = 86400000\nallowed_lateness_ms = 0'
    per_step: dict[int, list[int]] = {}
    for batch, per_partition in ((20, 300), (2_000, 6_000)):
        d = tmp_path / f"b{batch}"
        (d / "in").mkdir(parents=True)
        names = []
        for q in range(3):
            (d / "in" / f"p{q}.jsonl").write_text("".join(
                json.dumps({"user": f"u{i % 4}", "ts": 1_700_000_000_000 + i * 10 + q,
                            "amount": i % 7}) + "\n" for i in range(per_partition)))
            names.append(f"in/p{q}.jsonl")
        spec = _follow(write_spec(d, names, window=window, batch_size=batch,
                                  every_events=100_000), "end")
        job = _job(spec, 2)
        job.run()
        assert job.counters.events == 3 * per_partition
        steps = list(job.merger.step_bytes)
        outputs = list(job.merger.output_bytes)
        assert len(steps) >= 3
        assert not any(outputs[:-1])
        per_step[batch] = steps[:-1]  # the last step fires every window: results
    small, big = max(per_step[20]), max(per_step[2_000])
    assert big <= 4_000 and small <= 4_000, (small, big)
    assert big <= small + 200, (small, big)  # 100 times the events, the same bytes


# ----------------------------------------------------------------- rotation
APP = "in/app.jsonl"
PATIENCE_S = 300.0


def _rotation_spec(d: Path, stop: str, follow: bool = True, name: str = "spec.toml",
                   paths: list[str] | None = None) -> None:
    from sealstream.testing.specs import files_source, spec_text, tumbling

    source = files_source(paths or ["in/*.jsonl*"], "jsonl")
    if follow:
        source += f'\nfollow = true\npoll_ms = 20\nstop = "{stop}"'
    (d / name).write_text(spec_text(
        "rotation", source, batch_size=50, max_delay_ms=500, window=tumbling(1000),
        aggregates={"n": "count"}, late=True, errors=True, every_ms=50, keep=2))


def _app_lines(first: int, last: int, bad_at: int | None = None) -> str:
    return "".join("{not json\n" if i == bad_at
                   else json.dumps({"user": f"u{i % 3}", "ts": i * 100}) + "\n"
                   for i in range(first, last))


def _start(d: Path, ray: Any, spec: str = "spec.toml") -> tuple[subprocess.Popen[str], Log]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "sealstream", "run", spec, "--json", "--workers", "2",
         "--ray", ray.address], cwd=d, env=env(),
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    return proc, Log(proc)


def _wait_window(d: Path, proc: subprocess.Popen[str], end: int) -> None:
    """Until the window ending at ``end`` is committed (the job read that far)."""
    import time

    deadline = time.monotonic() + PATIENCE_S
    while True:
        ends: set[int] = set()
        for f in sorted((d / "out").glob("part-*.jsonl")):
            ends |= {json.loads(t)["window_end"] for t in f.read_text().splitlines()}
        if end in ends:
            return
        assert proc.poll() is None, f"the job ended (rc={proc.returncode})"
        assert time.monotonic() < deadline, f"window {end} never committed: {ends}"
        time.sleep(0.1)  # polling for committed output, not a timer


def _exit(proc: subprocess.Popen[str], log: Log) -> tuple[int, list[str]]:
    try:
        proc.wait(timeout=PATIENCE_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise AssertionError("the job did not stop: " + "".join(log.seen)) from None
    text = log.rest()
    return proc.returncode, [t for t in text.splitlines() if t.startswith("sealstream:")]


def test_a_rotation_during_a_worker_run_is_followed_exactly_once(
        ray_cluster: Any, tmp_path: Path) -> None:
    """The file renamed away (and written to once more) while its owner worker reads
    it, a new file at the path: the worker reads the old file to its end, then the new
    one as its continuation, as one process does; the renamed file, which matches the
    glob, is not a new partition. Equal to a bounded run over what the files held."""
    d = tmp_path / "job"
    (d / "in").mkdir(parents=True)
    a, b, c = _app_lines(0, 200), _app_lines(200, 250), _app_lines(250, 280)
    new1, new2 = _app_lines(280, 290, bad_at=283), _app_lines(290, 300)
    (d / APP).write_text(a)
    _rotation_spec(d, "never")
    _rotation_spec(d, "end", name="end.toml")
    proc, log = _start(d, ray_cluster)
    try:
        _wait_window(d, proc, 19_000)
        with open(d / APP, "a") as f:
            f.write(b)
        os.rename(d / APP, d / "in" / "app.jsonl.1")
        with open(d / "in" / "app.jsonl.1", "a") as f:
            f.write(c)  # the writer has not reopened yet
        (d / APP).write_text(new1)
        with open(d / APP, "a") as f:
            f.write(new2)
        _wait_window(d, proc, 29_000)
        proc.send_signal(signal.SIGTERM)
        rc, errors = _exit(proc, log)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert rc == 0, "".join(log.seen)  # as one process: the step finished, checkpointed
    assert [e for e in errors if not e.startswith("sealstream: SIGTERM")] == [], errors
    proc, log = _start(d, ray_cluster, "end.toml")
    rc, errors = _exit(proc, log)
    assert rc == 0 and not errors, "".join(log.seen)
    got = committed(d)
    # one file, read by worker 0: the key routing gives every key to worker 1, which
    # stages every result (docs/scale-out.md, "Key routing"), none the coordinator
    assert _staged_by(d, "out") == {"w1"}

    ref = tmp_path / "ref"
    (ref / "in").mkdir(parents=True)
    (ref / APP).write_text(a + b + c + new1 + new2)
    _rotation_spec(ref, "end", follow=False, paths=[APP])
    run_quiet(ref, timeout=PATIENCE_S)
    assert got == committed(ref)
    assert sum(json.loads(t)["n"] for t in got["out"]) == 299 and len(got["errors"]) == 1


def test_a_truncated_file_stops_a_worker_run_with_one_line(
        ray_cluster: Any, tmp_path: Path) -> None:
    """A followed file cut short while its owner worker reads it: the run stops with
    exit 1 and the single-process line (raised on the worker, no Ray traceback)."""
    d = tmp_path / "job"
    (d / "in").mkdir(parents=True)
    (d / APP).write_text(_app_lines(0, 200))
    _rotation_spec(d, "never", paths=[APP])
    proc, log = _start(d, ray_cluster)
    try:
        _wait_window(d, proc, 19_000)
        size = (d / APP).stat().st_size
        os.truncate(d / APP, size // 2)
        rc, errors = _exit(proc, log)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert rc == 1, "".join(log.seen)
    assert len(errors) == 1, errors
    assert "in/app.jsonl" in errors[0] and "was truncated" in errors[0]
    assert f"line offset 200 (byte {size})" in errors[0]
    assert "Traceback" not in "".join(log.seen)


def test_a_worker_node_without_the_files_stops_with_one_line(tmp_path: Path) -> None:
    """The owner of a followed partition on a node that does not see the source's
    directory (here: the directory moved away after the spec was loaded): one line
    naming the partition, the node and the path, instead of a file that silently
    never grows."""
    from sealstream import load_spec
    from sealstream.distributed._follow_read import FollowReader
    from sealstream.errors import SourceError

    d = tmp_path / "job"
    (d / "in").mkdir(parents=True)
    (d / APP).write_text(_app_lines(0, 10))
    _rotation_spec(d, "never", paths=[APP])
    pipeline = load_spec(d / "spec.toml")
    reader = FollowReader(pipeline)
    at, start, _ = reader.open_follow(0, APP, None, None, None, False)  # it sees them
    assert at == 0 and start["offset"] == 0
    reader.close()
    os.rename(d, tmp_path / "elsewhere")
    reader = FollowReader(pipeline)
    with pytest.raises(SourceError) as err:
        reader.open_follow(0, APP, start, 0, None, False)
    text = str(err.value)
    assert "\n" not in text
    assert f"followed file {APP!r} is not readable on node" in text
    assert str(d / APP) in text and "same path" in text


def test_the_owner_reports_a_full_position_that_resumes_exactly(tmp_path: Path) -> None:
    """The owner's side alone (no Ray): a range cut inside a poll reports a full
    position (the file's identity, a byte offset) at or before the range's end, from
    which a fresh reader (a restarted worker) reads on exactly at the next line; and a
    quiet file polled again and again keeps no more positions than it read."""
    from sealstream import load_spec
    from sealstream.distributed._follow_read import FollowReader, _Tracked

    d = tmp_path / "job"
    (d / "in").mkdir(parents=True)
    (d / APP).write_text(_app_lines(0, 10))
    _rotation_spec(d, "never", paths=[APP])
    pipeline = load_spec(d / "spec.toml")
    reader = FollowReader(pipeline)
    reader.open_follow(0, APP, None, None, None, False)
    assert reader.poll(0, 10, 0) == (10, 0, 9)
    events, _, _ = reader.take(0, APP, 0, 4, 10, 20)
    assert events["__off"].to_list() == [0, 1, 2, 3]
    pos = reader.position(0)
    assert pos is not None and pos["offset"] <= 4 and "ino" in pos["identity"]
    for _ in range(50):  # nothing new: no position kept for each poll
        reader.poll(0, 10, 0)
    events, _, _ = reader.take(0, APP, 4, 10, 10, 20)
    assert events["__off"].to_list() == [4, 5, 6, 7, 8, 9]
    for _ in range(50):
        reader.poll(0, 10, 0)
    held = reader.held[0].part
    assert isinstance(held, _Tracked) and len(held.marks) <= 2, held.marks
    reader.close()

    again = FollowReader(pipeline)  # a restarted owner, from the reported position
    at, _, _ = again.open_follow(0, APP, pos, 4, None, False)
    assert at == 4
    with (d / APP).open("a") as f:
        f.write(_app_lines(10, 12))
    events, _, _ = again.take(0, APP, 4, 12, 10, 20)
    assert events["__off"].to_list() == list(range(4, 12))
    again.close()


def test_the_owner_reports_the_new_file_of_a_rotation_read_past(tmp_path: Path) -> None:
    """A rotation polled past while the step's range ends in the old file: the resume
    position stays in the old file, and the owner also reports the new file it reads
    (with the old one retired), so the coordinator's discovery knows both at once (a
    renamed file matching the glob is never a new partition, even after a second
    rotation within the step)."""
    from sealstream import load_spec
    from sealstream.distributed._follow_read import FollowReader

    d = tmp_path / "job"
    (d / "in").mkdir(parents=True)
    (d / APP).write_text(_app_lines(0, 10))
    _rotation_spec(d, "never")
    reader = FollowReader(load_spec(d / "spec.toml"))
    reader.open_follow(0, APP, None, None, None, False)
    reader.poll(0, 10, 0)
    reader.take(0, APP, 0, 10, 10, 20)
    old = reader.position(0)
    assert old is not None and reader.reading(0) is None
    os.rename(d / APP, d / "in" / "app.jsonl.1")
    (d / APP).write_text(_app_lines(10, 15))
    assert reader.poll(0, 10, 0) == (15, 10, 14)
    events, _, _ = reader.take(0, APP, 10, 12, 10, 20)
    assert events["__off"].to_list() == [10, 11]
    resume, now = reader.position(0), reader.reading(0)
    assert resume is not None and now is not None
    assert resume["identity"]["ino"] == old["identity"]["ino"]
    assert now["identity"]["ino"] == (d / APP).stat().st_ino
    assert [r[1] for r in now["identity"]["retired"]] == [old["identity"]["ino"]]
    reader.close()


@pytest.mark.parametrize("deleted", [False, True])
def test_a_rotation_while_a_worker_run_was_stopped(ray_cluster: Any, tmp_path: Path,
                                                   deleted: bool) -> None:
    """Rotated while the job was stopped, resumed with workers: the owner finds the
    checkpoint's file under its new name by its identity and reads it to its end
    first; deleted, the unread tail is refused as expired data with the
    single-process line (exit 1), never skipped."""
    import re

    d = tmp_path / "job"
    (d / "in").mkdir(parents=True)
    a, b, new = _app_lines(0, 100), _app_lines(100, 150), _app_lines(150, 170)
    (d / APP).write_text(a)
    _rotation_spec(d, "never")
    _rotation_spec(d, "end", name="end.toml")
    proc, log = _start(d, ray_cluster)
    try:
        _wait_window(d, proc, 9_000)
        proc.send_signal(signal.SIGTERM)
        rc, _ = _exit(proc, log)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert rc == 0, "".join(log.seen)
    with open(d / APP, "a") as f:
        f.write(b)
    os.rename(d / APP, d / "in" / "app.jsonl.1")
    (d / APP).write_text(new)
    if deleted:
        (d / "in" / "app.jsonl.1").unlink()
    proc, log = _start(d, ray_cluster, "end.toml")
    rc, errors = _exit(proc, log)
    if deleted:
        assert rc == 1, "".join(log.seen)
        assert len(errors) == 1, errors
        assert re.search(r"partition 'in/app.jsonl': the saved position 100 \(byte \d+\) "
                         r"belongs to a file .* rotated away .* is gone", errors[0]), errors
        assert "--start-over" in errors[0]
        return
    assert rc == 0, "".join(log.seen)
    got = committed(d)
    ref = tmp_path / "ref"
    (ref / "in").mkdir(parents=True)
    (ref / APP).write_text(a + b + new)
    _rotation_spec(ref, "end", follow=False, paths=[APP])
    run_quiet(ref, timeout=PATIENCE_S)
    assert got == committed(ref)
    assert sum(json.loads(t)["n"] for t in got["out"]) == 170
