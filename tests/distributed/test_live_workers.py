"""Live sources on the data plane: each partition's worker reads it itself (its own
Kafka consumer, assigned; its own NATS connection) the ranges the coordinator
planned and recorded. The output equals one process reading the same topic; a
SIGKILLed coordinator resumes (with another worker count) by replaying the recorded
ranges on the workers; a lost worker restarts them all; what the coordinator
receives per step does not grow with the step's events."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

NATS_TESTS = Path(__file__).resolve().parents[1] / "sources" / "nats"
if str(NATS_TESTS) not in sys.path:
    sys.path.append(str(NATS_TESTS))

from _jet import Jet  # noqa: E402
from _live_case import (  # noqa: E402
    SPEC,
    KillWorker,
    LiveStory,
    assert_same_output,
    kafka_source_spec,
    live_job,
    live_spec,
    make_input,
    produce_input,
    run,
    write_spec,
)


def test_kafka_with_two_workers_equals_one_process(
        ray_cluster: Any, kafka: Any, live_story: LiveStory, tmp_path: Path,
        capsys: Any) -> None:
    """2 workers, each reading its partitions of the topic through its own consumer:
    results, late events and bad records equal one process's, exactly once; the
    coordinator planned and recorded the steps but read no record. Worker 0 reads two
    of the three partitions, so the key routing, decided once the partitions were
    opened, gives it fewer keys: 11 of 128 hash buckets (the checkpoints record it)."""
    import ray

    from sealstream.cli import main
    from sealstream.distributed.live import LivePlanner

    spec = live_spec(tmp_path, kafka.bootstrap, live_story)
    job = live_job(spec, 2)
    job.run()
    assert isinstance(job.merger, LivePlanner)
    assert len(job.names) == 3
    assert job.counters.events > 0 and job.counters.late_events > 0
    assert job.counters.bad_records > 0
    assert list((tmp_path / "ckpt" / "plans").glob("step-*.json")) or \
        job.merger.step > 0
    assert_same_output(tmp_path, live_story.dir)
    done = [r["processed"] for r in ray.get([a.plane_rows.remote() for a in job.merger.actors])]
    # 11 of 128 buckets (of this story's few keys, 27% of the rows against 73%)
    assert 0 < done[0] < done[1], done
    capsys.readouterr()
    assert main(["checkpoints", "inspect", str(tmp_path / "ckpt"), "--json"]) == 0
    routing = json.loads(capsys.readouterr().out)["distributed"]["routing"]
    assert routing["buckets_per_worker"] == [11, 117], routing


def test_a_lost_worker_restarts_every_worker_from_the_newest_checkpoint(
        ray_cluster: Any, kafka: Any, live_story: LiveStory, tmp_path: Path) -> None:
    """A worker SIGKILLed after a random step: every worker restarts from the newest
    checkpoint, the recorded steps after it are re-read by the new workers, and the
    output is one process's exactly once."""
    spec = live_spec(tmp_path, kafka.bootstrap, live_story)
    kill = KillWorker(random.Random(3), steps=8)
    job = live_job(spec, 2, progress=kill)
    job.run()
    assert kill.killed and job.restarts == 1
    assert_same_output(tmp_path, live_story.dir)


def test_sigkill_of_the_coordinator_then_resume_with_three_workers(
        ray_cluster: Any, kafka: Any, live_story: LiveStory, tmp_path: Path) -> None:
    """``run --workers 2`` SIGKILLed once a randomly drawn checkpoint is published
    (and the plans of the steps after it recorded), resumed with 3 workers: the
    recorded ranges are replayed by the workers that own them now, and the output
    is one process's exactly once (a rescale 2 -> 3 of a live run)."""
    spec = live_spec(tmp_path, kafka.bootstrap, live_story)
    target = random.Random(17).randint(1, 3)
    proc = subprocess.Popen(
        [sys.executable, "-m", "sealstream", "run", str(spec), "--quiet", "--workers", "2",
         "--ray", ray_cluster.address, "--batch-size", "20"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=dict(os.environ))
    try:
        while proc.poll() is None:
            if len(list((tmp_path / "ckpt").glob("cp-*/MANIFEST.json"))) >= target:
                proc.send_signal(signal.SIGKILL)
                break
            time.sleep(0.01)  # polling for the event (a published manifest), not a timer
        _, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL, f"the run ended before the kill: {err}"
    job = live_job(spec, 3)
    job.run()
    assert job.resumed_from is not None
    assert_same_output(tmp_path, live_story.dir)


def test_no_event_row_passes_through_the_coordinator(
        ray_cluster: Any, kafka: Any, tmp_path: Path) -> None:
    """A live run's steps of about 60 and of about 6,000 events: what the coordinator
    receives per step (the owners' reports, the slabs' summaries, the key workers'
    replies) is the same few hundred bytes. The steps' count is what costs (a few Ray
    round trips each): the small steps' run reads 15 of them (a topic of 300 events a
    partition), the large steps' run 3 (6,000 a partition)."""
    from confluent_kafka import Producer

    from sealstream.testing.brokers import create_topic

    window = 'kind = "tumbling"\nsize_ms = 86400000\nallowed_lateness_ms = 0'
    per_step: dict[int, list[int]] = {}
    for batch, per_partition in ((20, 300), (2_000, 6_000)):
        topic = f"in-{uuid.uuid4().hex[:12]}"
        create_topic(kafka.bootstrap, topic, 3)
        producer = Producer({"bootstrap.servers": kafka.bootstrap, "linger.ms": 20})
        for q in range(3):  # every event in one day-long window: nothing fires before the end
            for i in range(per_partition):
                producer.produce(topic, json.dumps({"user": f"u{i % 4}",
                                                    "ts": 1_700_000_000_000 + i * 10 + q,
                                                    "amount": i % 7}).encode(), partition=q)
        assert producer.flush(60) == 0
        d = tmp_path / f"b{batch}"
        (d / "in").mkdir(parents=True)
        spec = write_spec(d, ["in/none.jsonl"], window=window, batch_size=batch,
                          every_events=100_000)
        kafka_source_spec(spec, kafka.bootstrap, topic)
        job = live_job(spec, 2)
        job.run()
        assert job.counters.events == 3 * per_partition
        steps = list(job.merger.step_bytes)
        outputs = list(job.merger.output_bytes)
        assert len(steps) >= max(3, per_partition // batch)
        assert not any(outputs[:-1])
        per_step[batch] = steps[:-1]  # the last step fires every window: results
    small, big = max(per_step[20]), max(per_step[2_000])
    assert big <= 3_000 and small <= 3_000, (small, big)
    assert big <= small + 200, (small, big)  # 100 times the events, the same bytes


def test_nats_with_two_workers_equals_one_process(
        ray_cluster: Any, nats_server: Any, tmp_path: Path) -> None:
    """A JetStream stream of 3 subjects (with sequence gaps: the subjects interleave),
    read by 2 workers through connections of their own: one process's output."""
    from test_nats_run import nats_spec, publish_files

    jet = Jet(nats_server.url, f"S{uuid.uuid4().hex[:10]}")
    jet.create([f"p{i}" for i in range(3)])
    outs = []
    for workers in (None, 2):
        d = tmp_path / f"w{workers}"
        names = make_input(d, events=400, bad_every=61)
        if workers is None:
            publish_files(jet, d, names)
        spec = nats_spec(d, jet, names, **SPEC)
        if workers is None:
            res = run(spec)
            assert res.returncode == 0, res.stderr
        else:
            job = live_job(spec, workers)
            job.run()
            assert job.counters.late_events > 0
        outs.append(d)
    assert_same_output(outs[1], outs[0])


def test_nats_killed_while_fed_equals_one_process_replaying_the_recorded_plan(
        ray_cluster: Any, nats_server: Any, tmp_path: Path) -> None:
    """``stop = "never"`` with 2 workers while a producer publishes (late messages,
    bad ones, a subject that starts mid-run): SIGKILLed after random checkpoints, each
    time resumed (2 or 3 workers, drawn); then a ``stop = "end"`` run with workers.
    Here the steps' ranges decide which events are late, so the output is compared
    with ONE process replaying the recorded plan into a fresh store: equal, line for
    line. Each checkpoint hands the producer 3 to 5 rounds (of its 24; it was 1 to 3),
    so the job is killed about 3 times rather than 6 (each run starts its workers anew):
    still killed mid-feed at least twice, before and after subject c starts, and run
    on both worker counts."""
    from _live_story import Log, committed, copy_plans, env, run_quiet
    from test_nats_live_crash import Producer, spec_text

    rng = random.Random(23)
    jet = Jet(nats_server.url, f"S{uuid.uuid4().hex[:10]}")
    jet.create(["a", "b", "c"])
    d = tmp_path / "job"
    d.mkdir()
    (d / "never.toml").write_text(spec_text(jet, "never"), encoding="utf-8")
    (d / "end.toml").write_text(spec_text(jet, "end"), encoding="utf-8")
    producer = Producer(jet)
    producer.start()

    def credit() -> None:
        for _ in range(rng.randint(3, 5)):
            producer.credits.release()

    counts: list[str] = []

    def start(spec: str) -> subprocess.Popen[str]:
        workers = str(rng.choice([2, 3]))
        counts.append(workers)
        return subprocess.Popen(
            [sys.executable, "-m", "sealstream", "run", spec, "--json", "--workers",
             workers, "--ray", ray_cluster.address], cwd=d, env=env(),
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)

    kills = 0
    while producer.is_alive():
        proc = start("never.toml")
        try:
            Log(proc).checkpoints(rng.randint(1, 4), credit,
                                  give_up=lambda: not producer.is_alive())
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        kills += 1
    producer.join()
    assert producer.error is None, producer.error
    proc = start("end.toml")
    log = Log(proc)
    rest = log.rest()
    assert proc.returncode == 0, rest
    got = committed(d)

    ref = tmp_path / "ref"  # one process, the recorded plan, a fresh store
    copy_plans(d, ref)
    (ref / "end.toml").write_text(spec_text(jet, "end"), encoding="utf-8")
    run_quiet(ref, "end.toml", timeout=300)
    assert kills >= 2 and set(counts) == {"2", "3"}, (kills, counts)
    assert got == committed(ref)
    assert got["out"] and got["late"] and got["errors"]


def test_a_broker_lost_mid_run_fails_the_run_with_one_line(
        ray_cluster: Any, own_kafka: Any, tmp_path: Path) -> None:
    """The broker goes away while 2 workers read a ``stop = "never"`` topic: their
    clients (the coordinator's metadata lookups, the workers' consumers) retry for
    ``fail_after_ms`` (warning lines), then the run stops with exit 1 and one error
    line naming the broker, as one process does (no Ray traceback)."""
    d = tmp_path / "run"
    names = make_input(d, events=200)
    topic = produce_input(own_kafka.bootstrap, d, names)
    spec = write_spec(d, names, **SPEC)
    kafka_source_spec(spec, own_kafka.bootstrap, topic)
    spec.write_text(spec.read_text().replace(
        'stop = "end"', 'stop = "never"\nfail_after_ms = 3000'))
    proc = subprocess.Popen(
        [sys.executable, "-m", "sealstream", "run", str(spec), "--quiet", "--workers", "2",
         "--ray", ray_cluster.address],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=dict(os.environ))
    try:
        deadline = time.monotonic() + 300
        while not list((d / "ckpt").glob("cp-*/MANIFEST.json")):
            assert time.monotonic() < deadline and proc.poll() is None, proc.stderr
            time.sleep(0.05)  # polling for the event (a published manifest), not a timer
        own_kafka.broker.kill()
        _, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 1, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert all(ln.startswith("sealstream: ") for ln in lines), err  # no traceback
    errors = [ln for ln in lines if ln.startswith("sealstream: error:")]
    assert len(errors) == 1 and own_kafka.bootstrap in errors[0], err
