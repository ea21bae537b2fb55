"""Where a Kafka partition starts, against a real Kafka-protocol broker: ``start``
("latest" here) places only the partitions of a job's very first run; a partition
the job did not know at its restored checkpoint was created after the job began and
is read from its start; and where a partition started is recorded in the step plan,
so a run that crashes before its first checkpoint replays, and then continues, from
there (never from "latest" again, which would skip what was written meanwhile)."""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from sealstream._runtime.engine import Job, RunSummary
from sealstream.pipeline import load_spec

ck = pytest.importorskip("confluent_kafka")


def write_spec(d: Path, bootstrap: str, topic: str, stop: str, every_ms: int) -> Path:
    (d / "spec.toml").write_text(f"""
[pipeline]
name = "starts"

[source]
kind = "kafka"
bootstrap = "{bootstrap}"
topic = "{topic}"
start = "latest"
stop = "{stop}"
key = "user"
time = "ts"
poll_ms = 50

[watermark]
max_delay_ms = 1000

[window]
kind = "tumbling"
size_ms = 10000

[aggregates]
n = "count"

[sink]
kind = "jsonl"
path = "{d / 'out'}"

[late]
kind = "jsonl"
path = "{d / 'late'}"

[checkpoint]
path = "{d / 'ckpt'}"
every_ms = {every_ms}
""", encoding="utf-8")
    return d / "spec.toml"


def produce(bootstrap: str, topic: str, partition: int, user: str, times: list[int]) -> None:
    p = ck.Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for t in times:
        p.produce(topic, json.dumps({"user": user, "ts": t}).encode(), partition=partition)
    assert p.flush(30) == 0


def read_users(d: Path) -> dict[str, int]:
    """Events per user: committed counts plus late events."""
    out: dict[str, int] = {}
    for sub in ("out", "late"):
        for f in sorted((d / sub).glob("part-*.jsonl")) if (d / sub).is_dir() else []:
            for line in f.read_text(encoding="utf-8").splitlines():
                r = json.loads(line)
                user = r.get("key", r.get("user"))
                out[user] = out.get(user, 0) + int(r.get("n", 1))
    return out


def wait_for(cond: Callable[[], bool], what: str, limit_s: float = 120.0) -> None:
    deadline = time.monotonic() + limit_s
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


class Running:
    """A ``stop = "never"`` job run in a thread (its progress hook sees each step)."""

    def __init__(self, spec: Path, on_step: Callable[[Job], None] | None = None) -> None:
        self.job = Job(load_spec(spec), progress=on_step)
        self.summary: RunSummary | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.summary = self.job.run()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            self.error = exc

    def join(self) -> None:
        self.thread.join(180)
        assert not self.thread.is_alive()


def test_a_partition_added_while_the_job_was_stopped_is_read_from_its_start(
    kafka: Any, tmp_path: Path
) -> None:
    from confluent_kafka.admin import AdminClient, NewPartitions

    topic = kafka.new_topic(partitions=1)
    produce(kafka.bootstrap, topic, 0, "before", [1_000])  # before the start: not read
    run = Running(write_spec(tmp_path, kafka.bootstrap, topic, "never", 100))
    wait_for(lambda: run.job.merger is not None and run.job.names == [f"{topic}/0"],
             "the job to open its partition")
    produce(kafka.bootstrap, topic, 0, "a", [2_000, 3_000])
    wait_for(lambda: run.job.counters.events >= 2 or not run.thread.is_alive(),
             "the job to read partition 0")
    run.job.stop_requested = signal.SIGTERM  # what the CLI does on SIGTERM
    run.join()
    assert run.error is None and run.summary is not None
    assert run.summary.stopped_early

    admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
    for f in admin.create_partitions([NewPartitions(topic, 2)]).values():
        f.result(30)
    produce(kafka.bootstrap, topic, 1, "b", [4_000, 5_000, 6_000])
    produce(kafka.bootstrap, topic, 0, "a", [7_000])

    summary = Job(load_spec(write_spec(tmp_path, kafka.bootstrap, topic, "end", 100))).run()
    assert summary.resumed_from is not None
    # the new partition's records were all written after the job began: none skipped
    assert read_users(tmp_path) == {"a": 3, "b": 3}


class Crash(Exception):
    """Stands for a SIGKILL: the run stops where it is, no final checkpoint."""


def test_a_crash_before_the_first_checkpoint_replays_from_where_partitions_started(
    kafka: Any, tmp_path: Path
) -> None:
    topic = kafka.new_topic(partitions=2)
    produce(kafka.bootstrap, topic, 0, "before", [1_000])  # before the start: not read
    produce(kafka.bootstrap, topic, 1, "before", [1_000])
    opened = threading.Event()

    def crash_after_reading(job: Job) -> None:
        if job.merger is not None and len(job.names) == 2:
            opened.set()
        if job.counters.events >= 2:
            raise Crash

    # no checkpoint is due for a minute: the crash comes before the first one
    run = Running(write_spec(tmp_path, kafka.bootstrap, topic, "never", 60_000),
                  crash_after_reading)
    wait_for(opened.is_set, "the job to open its partitions")
    produce(kafka.bootstrap, topic, 0, "a", [2_000, 3_000])  # read, then the crash
    run.join()
    assert isinstance(run.error, Crash)
    assert not list((tmp_path / "ckpt").glob("cp-*"))  # no checkpoint was written
    # written while the job was down, after partition 1 was opened at "latest"
    produce(kafka.bootstrap, topic, 1, "b", [4_000, 5_000])
    produce(kafka.bootstrap, topic, 0, "a", [6_000])

    summary = Job(load_spec(write_spec(tmp_path, kafka.bootstrap, topic, "end", 100))).run()
    assert summary.counters.events == 5
    assert read_users(tmp_path) == {"a": 3, "b": 2}
