"""The outputs of live steps staged by the workers: with a Kafka source read by the
workers, results go into a part file of each key worker per epoch, late events and
bad records into a part file of the worker that reads their partition; the manifest
names every part, the coordinator tells the workers to commit after it, recovery
commits what the restored checkpoint names. The committed output is one process's;
no output row crosses the coordinator (its bytes per step do not grow with the
number of results, late events and bad records); exactly once after a SIGKILL of
the coordinator between the manifest and the workers' commits, a SIGKILLed worker,
and a rescale 2 -> 3."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from _live_case import KillWorker, LiveStory, assert_same_output, live_job, live_spec

from sealstream.testing.specs import spec_text

OUTPUTS = ("out", "late", "errors")


def _files(d: Path, sub: str, pattern: str) -> list[str]:
    return sorted(p.name for p in (d / sub).glob(pattern))


def _assert_staged_by_workers(d: Path, workers: range) -> None:
    """Every output has committed files of the given workers, none of the coordinator's
    own, and nothing left staged."""
    for sub in OUTPUTS:
        for i in workers:
            assert _files(d, sub, f"part-*w{i}.jsonl"), (sub, i)
        own = [n for n in _files(d, sub, "part-*.jsonl") if "w" not in n.split("-")[-1]]
        assert own == [], (sub, own)
        assert not _files(d, sub, ".part-*"), f"{sub}: staging left behind"


def test_kafka_outputs_staged_by_two_workers_equal_one_process(
        ray_cluster: Any, kafka: Any, live_story: LiveStory, tmp_path: Path) -> None:
    """2 workers read the 3 partitions and stage every output themselves: results,
    late events and bad records equal one process's, in files of both workers; the
    coordinator received no output row."""
    from sealstream.distributed.live import LivePlanner

    spec = live_spec(tmp_path, kafka.bootstrap, live_story)
    job = live_job(spec, 2)
    job.run()
    assert isinstance(job.merger, LivePlanner)
    assert job.counters.late_events > 0 and job.counters.bad_records > 0
    assert job.counters.results_written > 0
    assert sum(job.merger.output_bytes) == 0
    assert_same_output(tmp_path, live_story.dir)
    _assert_staged_by_workers(tmp_path, range(2))


def _produce(bootstrap: str, per_partition: int, late_share: float, bad_every: int,
             keys: int) -> str:
    """A 3-partition topic: events 10 ms apart, ``late_share`` of them two days old,
    a bad message every ``bad_every``."""
    from confluent_kafka import Producer

    from sealstream.testing.brokers import create_topic

    rng = random.Random(5)
    topic = f"in-{uuid.uuid4().hex[:12]}"
    create_topic(bootstrap, topic, 3)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
    for q in range(3):
        for i in range(per_partition):
            ts = 1_700_000_000_000 + i * 10 + q
            if i > 10 and rng.random() < late_share:
                ts -= 86_400_000 * 2
            producer.produce(topic, json.dumps({"user": f"u{i % keys}", "ts": ts,
                                                "amount": i % 7}).encode(), partition=q)
            if i % bad_every == bad_every - 1:
                producer.produce(topic, b'{"user": "u1", "ts": "not-a-time"}', partition=q)
    assert producer.flush(60) == 0
    return topic


def test_coordinator_bytes_do_not_grow_with_results_late_and_bad_rows(
        ray_cluster: Any, kafka: Any, tmp_path: Path) -> None:
    """The same number of events, once with a few results, late events and bad records
    (4 keys, a day-long window), once with about a result per event, a third of the
    events late and a bad message every 4: the coordinator receives the same bytes per
    step (counts and references) and no output row. (When it staged a live source's
    outputs it received every fired window, late event and bad record: tens of bytes
    per row, so here well above a byte per event.)"""
    per_step: dict[str, list[int]] = {}
    per_event: dict[str, float] = {}
    counts: dict[str, tuple[int, int, int]] = {}
    cases = (("few", 0.002, 2_000, 4, 'kind = "tumbling"\nsize_ms = 86400000'),
             ("many", 0.33, 4, 50, 'kind = "tumbling"\nsize_ms = 50'))
    for label, share, every, keys, window in cases:
        topic = _produce(kafka.bootstrap, 4_000, share, every, keys)
        d = tmp_path / label
        d.mkdir()
        spec = d / "spec.toml"
        spec.write_text(spec_text(
            "livebytes", f'kind = "kafka"\nbootstrap = "{kafka.bootstrap}"\n'
            f'topic = "{topic}"\nstop = "end"', batch_size=1_000,
            window=window + "\nallowed_lateness_ms = 0", aggregates={"n": "count"},
            late=True, errors=True, checkpoint='path = "ckpt"', every_events=3_000, keep=3))
        job = live_job(spec, 2)
        job.run()
        steps = list(job.merger.step_bytes)
        assert len(steps) >= 4, steps
        assert sum(job.merger.output_bytes) == 0
        per_step[label] = steps[:-1]  # the last step fires every window left
        counts[label] = (job.counters.results_written, job.counters.late_events,
                         job.counters.bad_records)
        per_event[label] = sum(steps) / job.counters.events
    assert counts["many"][0] > 2_000 and counts["many"][1] > 3_000, counts
    assert counts["many"][2] > 2_000, counts
    assert counts["few"][0] < 100 and counts["few"][1] < 100 and counts["few"][2] < 20, counts
    few, many = max(per_step["few"]), max(per_step["many"])
    assert many <= few + 200, (few, many)
    assert per_event["many"] < 1.0, per_event


def _killed_at(spec: Path, point: str, address: str, workers: int) -> None:
    env = dict(os.environ, SEALSTREAM_CRASH_AT=point)
    proc = subprocess.run(
        [sys.executable, "-m", "sealstream", "run", str(spec), "--quiet",
         "--workers", str(workers), "--ray", address],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env, timeout=600)
    assert proc.returncode == -signal.SIGKILL, f"not killed at {point}: {proc.stderr}"


@pytest.mark.parametrize("point", ["after_commit_worker_part:1",
                                   "after_commit_worker_records:1"])
def test_coordinator_killed_between_the_manifest_and_worker_commits_then_rescaled(
        ray_cluster: Any, kafka: Any, live_story: LiveStory, tmp_path: Path,
        point: str) -> None:
    """``run --workers 2`` SIGKILLs itself after the first worker's commit of an
    epoch (the manifest naming every worker's part is published, the other parts still
    staged); ``--workers 3`` resumes (a rescale 2 -> 3 of the live job): the restored
    checkpoint's parts are committed, the recorded steps after it replayed, every
    result, late event and bad record exactly once, the third worker staging its
    own."""
    spec = live_spec(tmp_path, kafka.bootstrap, live_story)
    _killed_at(spec, point, ray_cluster.address, 2)
    staged = [n for sub in OUTPUTS for n in _files(tmp_path, sub, ".part-*.inprogress")]
    assert staged, "the epoch's other parts should still be staged"
    job = live_job(spec, 3)
    job.run()
    assert job.resumed_from is not None
    assert_same_output(tmp_path, live_story.dir)
    for sub in OUTPUTS:
        assert not _files(tmp_path, sub, ".part-*"), f"{sub}: staging left behind"
    assert any(_files(tmp_path, sub, "part-*w2.jsonl") for sub in OUTPUTS)


def test_a_sigkilled_worker_loses_no_staged_output(
        ray_cluster: Any, kafka: Any, live_story: LiveStory, tmp_path: Path) -> None:
    """A worker SIGKILLed after a random step (its staged part files of the open epoch
    are lost with it): every worker restarts from the newest checkpoint, the staging of
    the lost epoch is deleted and replayed, and the committed output is one process's,
    exactly once, staged by both workers."""
    spec = live_spec(tmp_path, kafka.bootstrap, live_story)
    kill = KillWorker(random.Random(11), steps=10)
    job = live_job(spec, 2, progress=kill)
    job.run()
    assert kill.killed and job.restarts == 1
    assert_same_output(tmp_path, live_story.dir)
    _assert_staged_by_workers(tmp_path, range(2))
