"""The raw-event archive on a real Kafka-protocol broker (noida-db): a job crashes
(SIGKILL) after steps that read records it has not checkpointed yet; while it is
stopped the topic's records are deleted (``delete_records``, as retention would); the
resume reads them from the archive, verified against the signed step plans, then
goes on from the broker, and the output is exactly the files' output. A damaged or
missing segment stops the resume in one line naming it, committing nothing; the
archive on SeaweedFS (S3) works as on a directory."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from _archive_story import (
    delete_records,
    files_source,
    highest_read,
    kafka_source,
    log_start,
    newest_checkpoint_step,
    outcome,
    produce_lines,
    recorded_steps,
    run,
    write_spec,
)

from sealstream.testing.datagen import generate

pytest.importorskip("confluent_kafka")


#: reference outcomes already computed in this process, by the input files' contents
_REFERENCES: dict[tuple[tuple[str, bytes], ...], dict[str, list[tuple[Any, ...]]]] = {}


def _reference(tmp_path: Path, files: list[Path]) -> dict[str, list[tuple[Any, ...]]]:
    """The outcome of one run over the input files, run once per process and input
    (the tests generate the same files with the same seed; they only compare)."""
    key = tuple((f.name, f.read_bytes()) for f in files)
    if key not in _REFERENCES:
        d = tmp_path / "files"
        r = run(write_spec(d, files_source(files), archive=None))
        assert r.returncode == 0, r.stderr
        _REFERENCES[key] = outcome(d)
    return _REFERENCES[key]


def _crash_then_expire(kafka: Any, tmp_path: Path, archive: str = "archive",
                       environ: dict[str, str] | None = None, endpoint: str | None = None,
                       ) -> tuple[Path, Path, list[Path], str]:
    """A job killed after its 11th step, its newest checkpoint older than that; then
    every record it read is deleted from the topic. (job dir, spec, files, topic)"""
    files = generate(tmp_path / "data", events=120, keys=4, partitions=2, seed=7,
                     late_fraction=0.05, bad_fraction=0.05)
    topic = kafka.new_topic(partitions=2)
    produce_lines(kafka.bootstrap, topic, files)
    d = tmp_path / "job"
    spec = write_spec(d, kafka_source(kafka.bootstrap, topic), every=40, archive=archive,
                      endpoint=endpoint)
    r = run(spec, crash_at="batch:11", environ=environ)  # steps 1-11 read and archived
    assert r.returncode == -9, r.stderr
    read = highest_read(d / "ckpt")
    assert read and all(v > 0 for v in read.values()), read
    # steps recorded after the newest checkpoint: a resume replays them
    assert recorded_steps(d / "ckpt")[-1] > newest_checkpoint_step(d / "ckpt")
    # the broker forgets everything the job has read (retention, while it is stopped)
    delete_records(kafka.bootstrap, topic, {int(n.rsplit("/", 1)[1]): v for n, v in read.items()})
    assert all(log_start(kafka.bootstrap, topic, int(n.rsplit("/", 1)[1])) == v
               for n, v in read.items())
    return d, spec, files, topic


def _needed_segment(d: Path) -> str:
    """The name of a segment that the resume must read (a step after the newest
    checkpoint's)."""
    after = newest_checkpoint_step(d / "ckpt")
    for step in recorded_steps(d / "ckpt"):
        if step > after:
            doc = json.loads((d / "ckpt" / "plans" / f"step-{step:012d}.json").read_text())
            if doc.get("archive"):
                return str(doc["archive"]["name"])
    raise AssertionError("no archived step after the newest checkpoint")


def _committed_files(d: Path) -> dict[str, bytes]:
    return {str(f.relative_to(d)): f.read_bytes()
            for sub in ("out", "late", "errors") if (d / sub).is_dir()
            for f in sorted((d / sub).iterdir()) if f.is_file()
            and not f.name.startswith((".", "_"))}


def test_resume_reads_expired_records_from_the_archive(kafka: Any, tmp_path: Path) -> None:
    d, spec, files, topic = _crash_then_expire(kafka, tmp_path)
    # without the archive the same resume is refused (the records are gone)
    bare = tmp_path / "bare"
    shutil.copytree(d, bare)
    write_spec(bare, kafka_source(kafka.bootstrap, topic), archive=None, every=40)
    refused = run(bare / "spec.toml")
    assert refused.returncode == 1, refused.stderr
    assert "no longer on" in refused.stderr.strip().splitlines()[-1], refused.stderr
    # with it, the resume is exact
    r = run(spec)
    assert r.returncode == 0, r.stderr
    assert outcome(d) == _reference(tmp_path, files)
    assert sorted((d / "archive").glob("seg-*.parquet"))


@pytest.mark.parametrize("damage", ["flip", "truncate", "delete"])
def test_a_damaged_or_missing_segment_is_one_line_and_commits_nothing(
        kafka: Any, tmp_path: Path, damage: str) -> None:
    d, spec, files, _topic = _crash_then_expire(kafka, tmp_path)
    name = _needed_segment(d)
    seg = d / "archive" / name
    good = seg.read_bytes()
    if damage == "flip":
        seg.write_bytes(good[:100] + bytes([good[100] ^ 1]) + good[101:])
    elif damage == "truncate":
        seg.write_bytes(good[:len(good) // 2])
    else:
        seg.unlink()
    before = _committed_files(d)
    r = run(spec)
    assert r.returncode == 1, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("sealstream: error: "), r.stderr
    assert name in lines[0], lines[0]
    assert ("missing" if damage == "delete" else "damaged") in lines[0], lines[0]
    assert _committed_files(d) == before  # nothing committed, nothing lost
    # the object restored, the resume is exact
    seg.write_bytes(good)
    r = run(spec)
    assert r.returncode == 0, r.stderr
    assert outcome(d) == _reference(tmp_path, files)


def test_the_archive_in_s3(kafka: Any, s3_server: Any, tmp_path: Path) -> None:
    prefix = f"archive-{tmp_path.name}"
    d, spec, files, _topic = _crash_then_expire(
        kafka, tmp_path, archive=f"s3://{s3_server.bucket}/{prefix}",
        environ=s3_server.env())
    listed = s3_server.client().list_objects_v2(Bucket=s3_server.bucket, Prefix=prefix + "/")
    names = [o["Key"].rsplit("/", 1)[-1] for o in listed.get("Contents", [])]
    assert _needed_segment(d) in names
    assert not (d / "archive").exists()
    r = run(spec, environ=s3_server.env())
    assert r.returncode == 0, r.stderr
    assert outcome(d) == _reference(tmp_path, files)


def _replay(spec: Path, origin: str, dest: Path, environ: dict[str, str] | None = None
            ) -> Any:
    import subprocess
    import sys

    from _archive_story import env

    return subprocess.run([sys.executable, "-m", "sealstream", "replay", str(spec), "--from",
                           origin, "--to", str(dest), "--quiet"], capture_output=True,
                          text=True, timeout=300, env=env(environ))


def test_replay_of_an_interval_the_broker_expired(kafka: Any, tmp_path: Path) -> None:
    files = generate(tmp_path / "data", events=120, keys=4, partitions=2, seed=11,
                     late_fraction=0.05, bad_fraction=0.05)
    topic = kafka.new_topic(partitions=2)
    produce_lines(kafka.bootstrap, topic, files)
    d = tmp_path / "job"
    spec = write_spec(d, kafka_source(kafka.bootstrap, topic), every=40, keep=10)
    r = run(spec)
    assert r.returncode == 0, r.stderr
    first = sorted(int(p.name[3:]) for p in (d / "ckpt").glob("cp-*"))[0]
    # the interval after the first checkpoint, replayed while the broker has it
    before = _replay(spec, str(first), tmp_path / "replay-broker")
    assert before.returncode == 0, before.stderr
    expected = outcome(tmp_path / "replay-broker")
    assert expected["results"]
    read = highest_read(d / "ckpt")
    delete_records(kafka.bootstrap, topic, {int(n.rsplit("/", 1)[1]): v for n, v in read.items()})
    # the same replay after the broker deleted every record: from the archive
    after = _replay(spec, str(first), tmp_path / "replay-archive")
    assert after.returncode == 0, after.stderr
    assert outcome(tmp_path / "replay-archive") == expected
    # the replay only read the live archive: it wrote and pruned nothing there
    segments = sorted(p.name for p in (d / "archive").glob("seg-*"))
    assert segments == sorted(
        json.loads(f.read_text())["archive"]["name"]
        for f in (d / "ckpt" / "plans").glob("step-*.json")
        if "archive" in json.loads(f.read_text()))


def test_segments_are_pruned_with_the_checkpoints(kafka: Any, tmp_path: Path) -> None:
    files = generate(tmp_path / "data", events=200, keys=4, partitions=2, seed=5)
    topic = kafka.new_topic(partitions=2)
    produce_lines(kafka.bootstrap, topic, files)
    d = tmp_path / "job"
    r = run(write_spec(d, kafka_source(kafka.bootstrap, topic), every=20, keep=2))
    assert r.returncode == 0, r.stderr
    oldest = sorted((d / "ckpt").glob("cp-*/MANIFEST.json"))[0]
    oldest_step = int(json.loads(oldest.read_text())["plan"]["step"])
    last_step = newest_checkpoint_step(d / "ckpt")
    assert 0 < oldest_step < last_step
    steps = sorted(int(p.name.split("-")[1]) for p in (d / "archive").glob("seg-*.parquet"))
    # exactly the steps a retained checkpoint may need: those after the oldest one's
    plans = {s: json.loads((d / "ckpt" / "plans" / f"step-{s:012d}.json").read_text())
             for s in recorded_steps(d / "ckpt")}
    assert min(plans) == oldest_step + 1 and max(plans) == last_step
    assert steps == [s for s, doc in sorted(plans.items()) if "archive" in doc]
    assert steps and steps[0] == oldest_step + 1


def test_archive_list_and_verify(kafka: Any, tmp_path: Path,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    from sealstream.cli import main

    files = generate(tmp_path / "data", events=60, keys=3, partitions=1, seed=2)
    topic = kafka.new_topic(partitions=1)
    produce_lines(kafka.bootstrap, topic, files)
    d = tmp_path / "job"
    spec = write_spec(d, kafka_source(kafka.bootstrap, topic), every=20, keep=10)
    assert run(spec).returncode == 0
    (d / "archive" / "seg-000000009999-0123456789abcdef.parquet").write_bytes(b"orphan")
    capsys.readouterr()
    assert main(["archive", "verify", str(spec), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    verdicts = {r["name"]: r["verdict"] for r in doc["segments"]}
    assert verdicts.pop("seg-000000009999-0123456789abcdef.parquet") == "UNBOUND"
    assert verdicts and set(verdicts.values()) == {"OK"} and doc["ok"] is True
    first, second = sorted(verdicts)[:2]
    seg = d / "archive" / first
    seg.write_bytes(seg.read_bytes()[:-1] + b"x")
    (d / "archive" / second).unlink()
    assert main(["archive", "list", str(spec), "--json"]) == 0  # list reads no contents
    listed = {r["name"]: r["verdict"] for r in json.loads(capsys.readouterr().out)["segments"]}
    assert listed[first] == "OK" and listed[second] == "MISSING"
    assert main(["archive", "verify", str(spec), "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    got = {r["name"]: r["verdict"] for r in doc["segments"]}
    assert got[first] == "DAMAGED" and got[second] == "MISSING" and doc["ok"] is False
    assert main(["archive", "verify", str(tmp_path / "none.toml")]) == 2
