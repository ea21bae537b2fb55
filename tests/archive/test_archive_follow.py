"""The raw-event archive of followed files (``follow = true``; docs/object-storage.md,
"Raw-event archive", and docs/live.md, "Rotation and truncation").

A real ``sealstream run`` subprocess follows ``in/app.jsonl`` (or ``in/app.csv``); it is
SIGKILLed once its recorded step plans have read the whole file, its newest
checkpoint older than that (checkpoints every 200 events). While it is stopped the
file is rotated (renamed, a new file at the path) and the renamed file is deleted:
the positions the resume replays are in no file any more. The resume reads them from
the archive (verified against the signed step plans), then goes on with the new
file, and the committed output (out, late, errors) equals a bounded run over what the
files held, one after the other. The test waits on recorded plans and log lines,
never on a timer (the instant of a SIGKILL is the only thing chosen at random).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from _archive_story import newest_checkpoint_step, recorded_steps

from sealstream.testing.specs import files_source, spec_text, tumbling

SCENARIOS = Path(__file__).resolve().parents[1] / "scenarios"
if str(SCENARIOS) not in sys.path:
    sys.path.insert(0, str(SCENARIOS))

from _live_story import Log, committed, env  # noqa: E402

#: how long a condition may take on a loaded machine before the test gives up
PATIENCE_S = 180.0
HEADER = "user,ts\n"


def lines(kind: str, first: int, last: int, bad_at: int | None = None,
          late_at: int | None = None) -> str:
    """Events ``first..last-1`` (ts 100 ms apart, three users); a bad record instead of
    event ``bad_at``, a late one (ts 0) instead of event ``late_at``."""
    out = []
    for i in range(first, last):
        ts = 0 if i == late_at else i * 100
        if kind == "csv":
            out.append("bad row\n" if i == bad_at else f"u{i % 3},{ts}\n")
        else:
            out.append("{not json\n" if i == bad_at
                       else json.dumps({"user": f"u{i % 3}", "ts": ts}) + "\n")
    return "".join(out)


def app(kind: str) -> str:
    return f"in/app.{kind}"


def write_specs(d: Path, kind: str, archive: str | None = "archive",
                endpoint: str | None = None) -> None:
    """spec.toml (stop = "never") and end.toml (stop = "end") following in/app.KIND;
    checkpoints every 200 events (steps read at most 50 lines: a checkpoint is taken
    after 200 to 249 lines, and the steps after it, up to line 300, are not
    checkpointed)."""
    section = ""
    if archive is not None:
        section = f'\n[archive]\nurl = "{archive}"\n'
        if endpoint:
            section += f'endpoint_url = "{endpoint}"\n'
    for name, stop in (("spec.toml", "never"), ("end.toml", "end")):
        source = files_source([app(kind)], kind) + \
            f'\nfollow = true\npoll_ms = 20\nstop = "{stop}"'
        (d / name).write_text(spec_text(
            "archfollow", source, batch_size=50, max_delay_ms=500, window=tumbling(1000),
            aggregates={"n": "count"}, late=True, errors=True, every_events=200,
            keep=10) + section)


def job_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    e = env()
    e.update(extra or {})
    return e


def start(d: Path, spec: str = "spec.toml", extra: dict[str, str] | None = None
          ) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "sealstream", "run", spec, "--json"], cwd=d,
        env=job_env(extra), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def run_once(d: Path, spec: str = "end.toml", extra: dict[str, str] | None = None,
             *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sealstream", "run", spec, "--quiet", *args],
                          cwd=d, env=job_env(extra), capture_output=True, text=True,
                          timeout=PATIENCE_S, check=False)


def replay(d: Path, origin: str, dest: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sealstream", "replay", "end.toml", "--from",
                           origin, "--to", str(dest), "--quiet"], cwd=d, env=job_env(),
                          capture_output=True, text=True, timeout=PATIENCE_S, check=False)


def sigkill(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait()


def read_to(d: Path, proc: subprocess.Popen[str], name: str, position: int) -> None:
    """Until a recorded step plan reads ``name`` up to ``position`` (plans are durable
    before their step's output, checkpoints or not)."""
    deadline = time.monotonic() + PATIENCE_S
    while True:
        for f in sorted((d / "ckpt" / "plans").glob("step-*.json")):
            try:
                rng = json.loads(f.read_text())["ranges"].get(name)
            except ValueError:
                continue  # being written
            if rng is not None and rng[1] >= position:
                return
        assert proc.poll() is None, f"the job ended (rc={proc.returncode})"
        assert time.monotonic() < deadline, f"{name} never read up to {position}"
        time.sleep(0.1)


def read_all(d: Path, position: int) -> bool:
    """Whether a recorded step plan reads in/app.jsonl up to ``position``."""
    for f in sorted((d / "ckpt" / "plans").glob("step-*.json")):
        try:
            rng = json.loads(f.read_text())["ranges"].get(app("jsonl"))
        except ValueError:
            continue  # being written
        if rng is not None and rng[1] >= position:
            return True
    return False


def bounded(d: Path, kind: str, content: str) -> dict[str, list[str]]:
    """The committed output of a bounded run over ``content`` as in/app.KIND."""
    (d / "in").mkdir(parents=True)
    (d / app(kind)).write_text(content)
    (d / "spec.toml").write_text(spec_text(
        "archfollow", files_source([app(kind)], kind), batch_size=50, max_delay_ms=500,
        window=tumbling(1000), aggregates={"n": "count"}, late=True, errors=True))
    r = run_once(d, "spec.toml")
    assert r.returncode == 0, r.stderr
    return committed(d)


def needed_segment(d: Path) -> str:
    """A segment the resume must read: of a step after the newest checkpoint's."""
    after = newest_checkpoint_step(d / "ckpt")
    for step in recorded_steps(d / "ckpt"):
        if step > after:
            doc = json.loads((d / "ckpt" / "plans" / f"step-{step:012d}.json").read_text())
            if doc.get("archive"):
                return str(doc["archive"]["name"])
    raise AssertionError("no archived step after the newest checkpoint")


def crash_then_rotate_away(d: Path, kind: str, archive: str | None = "archive",
                           extra: dict[str, str] | None = None,
                           endpoint: str | None = None) -> tuple[str, str]:
    """The job reads the whole file (300 lines), is SIGKILLed with steps recorded after
    its newest checkpoint; the file is rotated (a new file of 100 lines at the path) and
    the renamed file deleted. (the first file's content, the new file's)"""
    (d / "in").mkdir(parents=True)
    first = (HEADER if kind == "csv" else "") + lines(kind, 0, 300, bad_at=262, late_at=275)
    new = (HEADER if kind == "csv" else "") + lines(kind, 300, 400, bad_at=330)
    (d / app(kind)).write_text(first)
    write_specs(d, kind, archive, endpoint)
    proc = start(d, extra=extra)
    Log(proc).checkpoints(1)  # the one checkpoint, after 200 to 249 lines
    read_to(d, proc, app(kind), 300)
    sigkill(proc)
    # steps recorded after the newest checkpoint: a resume replays them
    assert recorded_steps(d / "ckpt")[-1] > newest_checkpoint_step(d / "ckpt")
    os.rename(d / app(kind), d / "in" / f"app.{kind}.1")
    (d / app(kind)).write_text(new)
    (d / "in" / f"app.{kind}.1").unlink()
    return first, new


#: reference outputs already computed in this process, by kind and input text
_REFERENCES: dict[tuple[str, str], dict[str, list[str]]] = {}


def reference(tmp_path: Path, kind: str, first: str, new: str) -> dict[str, list[str]]:
    """What one uninterrupted run reads: the first file's lines, then the new file's
    records (a CSV file's header is its own). Run once per process and input (several
    tests resume the same crash story; they only compare with it)."""
    if kind == "csv":
        new = new[len(HEADER):]
    if (kind, first + new) not in _REFERENCES:
        _REFERENCES[kind, first + new] = bounded(tmp_path / "ref", kind, first + new)
    return _REFERENCES[kind, first + new]


def one_error(r: subprocess.CompletedProcess[str]) -> str:
    msgs = [t for t in r.stderr.splitlines() if t.startswith("sealstream:")]
    assert len(msgs) == 1, r.stderr
    return msgs[0]


def committed_files(d: Path) -> dict[str, bytes]:
    return {str(f.relative_to(d)): f.read_bytes()
            for sub in ("out", "late", "errors") if (d / sub).is_dir()
            for f in sorted((d / sub).iterdir()) if f.is_file()
            and not f.name.startswith((".", "_"))}


# ----------------------------------------------------------------- resume
@pytest.mark.parametrize("kind", ["jsonl", "csv"])
def test_a_rotated_file_deleted_while_stopped_resumes_from_the_archive(
        tmp_path: Path, kind: str) -> None:
    d = tmp_path / "job"
    first, new = crash_then_rotate_away(d, kind)
    assert sorted((d / "archive").glob("seg-*.parquet"))
    # without the archive the same resume is refused: the positions are in no file
    bare = tmp_path / "bare"
    shutil.copytree(d, bare)
    write_specs(bare, kind, archive=None)
    msg = one_error(refused := run_once(bare))
    assert refused.returncode == 1, refused.stderr
    assert "rotated away" in msg and "is gone" in msg and "[archive]" in msg, msg
    # with it, the resume is exact
    r = run_once(d)
    assert r.returncode == 0, r.stderr
    got = committed(d)
    assert got == reference(tmp_path, kind, first, new)
    assert sum(json.loads(t)["n"] for t in got["out"]) == 397 and len(got["errors"]) == 2
    assert len(got["late"]) == 1


def test_the_archive_in_s3(tmp_path: Path, s3_server: Any) -> None:
    d = tmp_path / "job"
    prefix = f"archive-{tmp_path.name}"
    first, new = crash_then_rotate_away(
        d, "jsonl", archive=f"s3://{s3_server.bucket}/{prefix}", extra=s3_server.env())
    listed = s3_server.client().list_objects_v2(Bucket=s3_server.bucket, Prefix=prefix + "/")
    names = [o["Key"].rsplit("/", 1)[-1] for o in listed.get("Contents", [])]
    assert needed_segment(d) in names
    assert not (d / "archive").exists()
    r = run_once(d, extra=s3_server.env())
    assert r.returncode == 0, r.stderr
    assert committed(d) == reference(tmp_path, "jsonl", first, new)


def test_sigkill_at_random_instants_of_a_resume_from_the_archive(tmp_path: Path) -> None:
    rng = random.Random(30)
    d = tmp_path / "job"
    first, new = crash_then_rotate_away(d, "jsonl")
    with open(d / app("jsonl"), "a") as f:  # more lines: more steps to be killed among
        f.write(lines("jsonl", 400, 1400))
    new += lines("jsonl", 400, 1400)
    for _ in range(3):
        proc = start(d)
        log = Log(proc)
        # a random instant: after 0-2 checkpoint lines (fewer once the job has read
        # everything: it checkpoints no more), then up to 0.3 s more
        log.checkpoints(rng.randint(0, 2), give_up=lambda: read_all(d, 1400))
        time.sleep(rng.uniform(0, 0.3))
        sigkill(proc)
        assert proc.returncode == -signal.SIGKILL, "".join(log.seen)
    r = run_once(d)
    assert r.returncode == 0, r.stderr
    assert committed(d) == reference(tmp_path, "jsonl", first, new)


# ----------------------------------------------------------------- replay
def test_replay_across_the_rotation_reads_the_gone_file_from_the_archive(
        tmp_path: Path) -> None:
    d = tmp_path / "job"
    (d / "in").mkdir(parents=True)
    (d / app("jsonl")).write_text(lines("jsonl", 0, 300, bad_at=250, late_at=270))
    write_specs(d, "jsonl")
    proc = start(d)
    log = Log(proc)
    read_to(d, proc, app("jsonl"), 300)
    os.rename(d / app("jsonl"), d / "in" / "app.jsonl.1")  # rotated while it runs
    (d / app("jsonl")).write_text(lines("jsonl", 300, 400, bad_at=330))
    read_to(d, proc, app("jsonl"), 400)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=PATIENCE_S) == 0, log.rest()
    first = sorted(int(p.name[3:]) for p in (d / "ckpt").glob("cp-*"))[0]
    manifest = json.loads((d / "ckpt" / f"cp-{first:012d}" / "MANIFEST.json").read_text())
    assert manifest["positions"][0]["next_offset"] < 300  # in the renamed file
    # the interval after the first checkpoint, replayed while the renamed file exists
    before = replay(d, str(first), tmp_path / "replay-files")
    assert before.returncode == 0, before.stderr
    expected = committed(tmp_path / "replay-files")
    assert expected["out"] and expected["errors"]
    (d / "in" / "app.jsonl.1").unlink()
    after = replay(d, str(first), tmp_path / "replay-archive")
    assert after.returncode == 0, after.stderr
    assert committed(tmp_path / "replay-archive") == expected


# ----------------------------------------------------------------- refusals
def test_an_archive_that_does_not_cover_the_gap_is_named(tmp_path: Path) -> None:
    """Steps recorded without an archive read the gone file: adding [archive] later
    cannot bring those lines back; the refusal names it and what it holds."""
    d = tmp_path / "job"
    crash_then_rotate_away(d, "jsonl", archive=None)
    write_specs(d, "jsonl")
    before = committed_files(d)
    r = run_once(d)
    assert r.returncode == 1, r.stderr
    msg = one_error(r)
    assert "rotated away" in msg and "is gone" in msg, msg
    assert f"The archive {d / 'archive'} does not cover them" in msg, msg
    assert "it holds none of 'in/app.jsonl''s positions" in msg, msg
    assert committed_files(d) == before


@pytest.mark.parametrize("damage", ["flip", "delete"])
def test_a_tampered_segment_is_refused(tmp_path: Path, damage: str) -> None:
    d = tmp_path / "job"
    first, new = crash_then_rotate_away(d, "jsonl")
    name = needed_segment(d)
    seg = d / "archive" / name
    good = seg.read_bytes()
    if damage == "flip":
        seg.write_bytes(good[:100] + bytes([good[100] ^ 1]) + good[101:])
    else:
        seg.unlink()
    before = committed_files(d)
    r = run_once(d)
    assert r.returncode == 1, r.stderr
    msg = one_error(r)
    assert name in msg and ("damaged" if damage == "flip" else "missing") in msg, msg
    assert committed_files(d) == before  # nothing committed, nothing lost
    seg.write_bytes(good)  # restored: the resume is exact
    r = run_once(d)
    assert r.returncode == 0, r.stderr
    assert committed(d) == reference(tmp_path, "jsonl", first, new)


def test_a_file_that_took_the_archived_files_inode_is_not_taken_for_it(
        tmp_path: Path) -> None:
    """The archive's last line is in the rotation's new file B; while the job is down,
    the file of its checkpoint is deleted and B is replaced by a file C that took B's
    inode (logrotate deleting B and creating C, ext4 reusing the freed inode). Found by
    device and inode, C must not be read from B's byte offset: it does not hold the
    archive's last line, so the run goes on with C from its first line."""
    d = tmp_path / "job"
    (d / "in").mkdir(parents=True)
    first = lines("jsonl", 0, 300, bad_at=262, late_at=275)
    b = lines("jsonl", 300, 390)  # under the next checkpoint (at 400 to 449 lines)
    c = lines("jsonl", 390, 1200, bad_at=700)  # longer than B: B's end is inside it
    (d / app("jsonl")).write_text(first)
    write_specs(d, "jsonl")
    proc = start(d)
    Log(proc).checkpoints(1)  # in the first file
    read_to(d, proc, app("jsonl"), 300)
    os.rename(d / app("jsonl"), d / "in" / "app.jsonl.1")
    (d / app("jsonl")).write_text(b)
    read_to(d, proc, app("jsonl"), 390)  # B read and archived, no checkpoint in it
    sigkill(proc)
    assert len(list((d / "ckpt").glob("cp-*"))) == 1
    (d / "in" / "app.jsonl.1").unlink()  # the checkpoint's file is gone: the archive
    ino = (d / app("jsonl")).stat().st_ino
    (d / app("jsonl")).write_text(c)  # in place: C has B's inode
    assert (d / app("jsonl")).stat().st_ino == ino
    r = run_once(d)
    assert r.returncode == 0, r.stderr
    assert committed(d) == reference(tmp_path, "jsonl", first, b + c)
