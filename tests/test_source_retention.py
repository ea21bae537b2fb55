"""Source retention: a partition file that shrank, was replaced or rotated since
the checkpoint stops the run (exit 1, one line naming the partition, the position,
what changed and the way out); an appended file resumes exactly once."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from scenarios._story import assert_same_output, committed, make_input, run, write_spec


@pytest.fixture(scope="module")
def crashed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("crashed")
    spec = write_spec(d, make_input(d))
    res = run(spec, crash_at="after_retention:3")
    assert res.returncode == -9, res.stderr
    return d


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def truncate(f: Path) -> str:
    data = f.read_bytes()
    f.write_bytes(data[:200])
    return "shorter"


def same_size_other_content(f: Path) -> str:
    data = f.read_bytes()
    first = data.index(b'"u')
    f.write_bytes(data[:first] + b'"v' + data[first + 2:])  # same size, other first record
    assert len(f.read_bytes()) == len(data)
    return "first bytes differ"


def checkpoint_byte_offset(f: Path) -> int:
    """The byte position of partition ``in/<f>`` in the job's newest checkpoint."""
    job = f.parent.parent
    res = subprocess.run(
        [sys.executable, "-m", "sealstream", "checkpoints", "inspect", str(job / "ckpt"),
         "--json"], capture_output=True, text=True, check=True,
    )
    parts = json.loads(res.stdout)["partitions"]
    return int(next(p["byte_offset"] for p in parts if p["partition"] == f"in/{f.name}"))


def same_size_other_tail(f: Path) -> str:
    # a change just before the checkpoint position, far from the head of the file
    pos = checkpoint_byte_offset(f)
    data = f.read_bytes()
    assert pos > 4300, pos  # the identity hashes the first 4 KiB: change a byte past them
    j = data.rindex(b"}", 4200, pos) - 1  # the last record ending before the position
    assert data[j:j + 1].isdigit()
    new = data[:j] + (b"0" if data[j:j + 1] != b"0" else b"1") + data[j + 1:]
    assert len(new) == len(data) and new != data
    f.write_bytes(new)
    return "bytes before that position differ"


def rotated(f: Path) -> str:
    os.rename(f, f.with_suffix(".jsonl.1"))
    other = tmp_input(f.parent.parent / "other", seed=99)
    shutil.copy(other, f)
    return "first bytes differ"


def tmp_input(d: Path, seed: int) -> Path:
    make_input(d, partitions=1, events=600, seed=seed)
    return d / "in" / "p0.jsonl"


@pytest.mark.parametrize("change", [truncate, same_size_other_content, same_size_other_tail,
                                    rotated])
def test_a_changed_partition_stops_the_run_with_one_clear_line(
    crashed: Path, tmp_path: Path, change: Callable[[Path], str]
) -> None:
    d = _copy(crashed, tmp_path / "job")
    what = change(d / "in" / "p0.jsonl")
    before = sorted(p.relative_to(d) for p in (d / "out").rglob("*"))
    res = run(d / "spec.toml")
    assert res.returncode == 1
    err = res.stderr.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert "partition 'in/p0.jsonl' changed since its checkpoint at offset" in err
    assert "(byte " in err and what in err
    assert "replay from an earlier position into an isolated destination" in err
    assert sorted(p.relative_to(d) for p in (d / "out").rglob("*")) == before
    # it keeps refusing: nothing was read from the wrong place
    assert run(d / "spec.toml").returncode == 1


def test_an_appended_partition_resumes_exactly_once(crashed: Path, tmp_path: Path) -> None:
    d = _copy(crashed, tmp_path / "job")
    extra = '{"user": "u1", "ts": 1700000900000, "amount": 3, "i": 9999}\n' * 3
    with (d / "in" / "p1.jsonl").open("a") as f:
        f.write(extra)
    res = run(d / "spec.toml")
    assert res.returncode == 0, res.stderr
    ref = tmp_path / "ref"
    names = make_input(ref)
    with (ref / "in" / "p1.jsonl").open("a") as f:
        f.write(extra)
    assert run(write_spec(ref, names)).returncode == 0
    assert_same_output(d, ref)


# -- a partition changed while the run reads it ------------------------------------------


def _big_story(d: Path, events: int) -> Path:
    """One large partition, checkpoints every 20,000 events, bad records diverted
    (a line cut in half would be one, and the run would go on)."""
    (d / "in").mkdir(parents=True)
    with (d / "in" / "p.jsonl").open("w") as f:
        for i in range(events):
            f.write(json.dumps({"user": f"u{i % 13}", "ts": i * 7, "amount": i % 100}) + "\n")
    spec = d / "spec.toml"
    spec.write_text(
        '[pipeline]\nname = "cut"\nbatch_size = 5000\n\n[source]\nkind = "jsonl"\n'
        'paths = ["in/p.jsonl"]\nkey = "user"\ntime = "ts"\n\n'
        '[window]\nkind = "tumbling"\nsize_ms = 10000\n\n'
        '[aggregates]\nn = "count"\ntotal = "sum(amount)"\n\n'
        '[sink]\nkind = "jsonl"\npath = "out"\n\n[errors]\nkind = "jsonl"\npath = "errors"\n\n'
        '[checkpoint]\npath = "ckpt"\nevery_events = 20000\n'
    )
    return spec


def _cut(f: Path) -> None:
    with f.open("r+b") as fh:  # in place, to 40 %, in the middle of a line
        fh.truncate(f.stat().st_size * 2 // 5 + 5)


def _copytruncate(f: Path) -> None:
    data = f.read_bytes()
    with f.open("r+b") as fh:  # logrotate's copytruncate, then the writer goes on
        fh.truncate(0)
        fh.write(data.replace(b'"u', b'"w'))


@pytest.mark.parametrize("change", [_cut, _copytruncate])
def test_a_partition_changed_while_read_stops_the_run(
    tmp_path: Path, change: Callable[[Path], None]
) -> None:
    """Run, pause right after checkpoint 2 is committed, change the input, go on:
    exit 1 naming the file, nothing wrong committed; with the file restored the
    rerun resumes and the output is exactly the uninterrupted run's."""
    events = 200_000
    ref, job = tmp_path / "ref", tmp_path / "job"
    assert run(_big_story(ref, events)).returncode == 0
    spec = _big_story(job, events)
    original = (job / "in" / "p.jsonl").read_bytes()
    env = dict(os.environ, SEALSTREAM_PAUSE_AT="after_retention:2")
    env.pop("SEALSTREAM_CRASH_AT", None)
    with subprocess.Popen([sys.executable, "-m", "sealstream", "run", str(spec), "--quiet"],
                          env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                          text=True) as proc:
        try:
            _, status = os.waitpid(proc.pid, os.WUNTRACED)  # it stops itself
            assert os.WIFSTOPPED(status), f"the run ended before the pause: {status}"
            change(job / "in" / "p.jsonl")
            os.kill(proc.pid, signal.SIGCONT)
            _, err = proc.communicate(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
    assert proc.returncode == 1, err
    line = err.strip()
    assert len(line.splitlines()) == 1 and "Traceback" not in line
    assert "partition 'in/p.jsonl' (" in line and "changed while it was read" in line
    # what was committed is part of the uninterrupted run's output, value for value,
    # and no half line was reported as a bad record
    want = {(r["key"], r["window_start"]): r for r in committed(ref, "out")}
    got = committed(job, "out")
    assert got and all(want[(r["key"], r["window_start"])] == r for r in got)
    assert committed(job, "errors") == []
    (job / "in" / "p.jsonl").write_bytes(original)
    again = run(spec)
    assert again.returncode == 0, again.stderr
    assert_same_output(job, ref)


def test_a_half_written_last_line_that_grew_after_a_checkpoint_is_refused(
    tmp_path: Path
) -> None:
    """Partition p0 ends in the line being written when the run opened it (no
    newline): the bounded run takes it as it was (a bad record) and checkpoints a
    position inside it while the other partitions go on. Killed, the line then
    completed and more appended: the resume refuses (exit 1) instead of reading the
    rest of the line as a new record."""
    d = tmp_path / "job"
    names = make_input(d)
    p0 = d / "in" / "p0.jsonl"
    lines = p0.read_text().splitlines(keepends=True)
    whole = "".join(lines[:6])
    p0.write_text(whole[: len(whole) - 12])  # the 6th line cut 11 bytes before its end
    spec = write_spec(d, names, errors=True)
    crashed = run(spec, crash_at="after_retention:3")
    assert crashed.returncode == -9, crashed.stderr
    bad = committed(d, "errors")
    assert [(r["_partition"], r["_offset"]) for r in bad] == [("in/p0.jsonl", 5)]
    with p0.open("a") as f:
        f.write(whole[len(whole) - 12:] + "".join(lines[6:]))
    res = run(spec)
    assert res.returncode == 1, res.stderr
    err = res.stderr.strip()
    assert len(err.splitlines()) == 1 and "partition 'in/p0.jsonl' changed since its" in err
    assert "had no newline when it was read and has grown since" in err
