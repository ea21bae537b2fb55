"""The raw-event archive on a real Kafka-protocol broker (noida-db): a job crashes
(SIGKILL) after steps that read records it has not checkpointed yet; while it is
stopped the topic's records are deleted (``delete_records``, as retention would); the
resume reads them from the archive, verified against the signed step plans, then
goes on from the broker, and the output is exactly the files' output."""

from __future__ import annotations

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


def _reference(tmp_path: Path, files: list[Path]) -> dict[str, list[tuple[Any, ...]]]:
    d = tmp_path / "files"
    r = run(write_spec(d, files_source(files), archive=None))
    assert r.returncode == 0, r.stderr
    return outcome(d)


def test_resume_reads_expired_records_from_the_archive(kafka: Any, tmp_path: Path) -> None:
    files = generate(tmp_path / "data", events=120, keys=4, partitions=2, seed=7,
                     late_fraction=0.05, bad_fraction=0.05)
    topic = kafka.new_topic(partitions=2)
    produce_lines(kafka.bootstrap, topic, files)
    d = tmp_path / "job"
    spec = write_spec(d, kafka_source(kafka.bootstrap, topic), every=40)
    r = run(spec, crash_at="batch:11")  # steps 1-9 read and archived; not all checkpointed
    assert r.returncode == -9, r.stderr
    read = highest_read(d / "ckpt")
    # steps recorded after the newest checkpoint: a resume replays them
    assert recorded_steps(d / "ckpt")[-1] > newest_checkpoint_step(d / "ckpt")
    assert read and all(v > 0 for v in read.values()), read
    # the broker forgets everything the job has read (retention, while it is stopped)
    delete_records(kafka.bootstrap, topic, {int(n.rsplit("/", 1)[1]): v for n, v in read.items()})
    assert all(log_start(kafka.bootstrap, topic, int(n.rsplit("/", 1)[1])) == v
               for n, v in read.items())
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
