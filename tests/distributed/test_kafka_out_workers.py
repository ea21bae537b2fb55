"""Kafka results produced by the workers: each key worker owns a transactional
producer (``transactional.id`` = the job's id + ``-w<i>``), stages its rows of each
epoch at the checkpoint and commits its own transaction when the coordinator tells
it to after the manifest. A ``read_committed`` consumer sees one process's records
(the same multiset; per partition, each key's records in the same order); no result
row crosses the coordinator; exactly once after a worker SIGKILLed inside its
transaction and across rescales 2 -> 3 and 3 -> 2, where a producer of an index that
no longer exists is fenced."""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

SCENARIOS = Path(__file__).resolve().parents[1] / "scenarios"
if str(SCENARIOS) not in sys.path:  # _kafka_story imports _story as its neighbour
    sys.path.append(str(SCENARIOS))

from _kafka_story import kafka_source_spec, produce_input  # noqa: E402
from _story import make_input, write_spec  # noqa: E402

from sealstream.testing.brokers import create_topic  # noqa: E402
from sealstream.testing.kafka_read import read_committed  # noqa: E402

EVENTS = 600
SPEC = {"every_events": 150, "batch_size": 40, "errors": True}
#: a worker's token: ``<epoch>-<run>w<i>``
WORKER_TOKEN = re.compile(r"[0-9]{12,}-[0-9a-f]+w([0-9]+)")


def _kafka_results(spec: Path, bootstrap: str) -> str:
    """Send the spec's results to a new 2-partition topic (late events and bad records
    stay JSON Lines directories); returns the topic."""
    topic = f"r-{uuid.uuid4().hex[:12]}"
    create_topic(bootstrap, topic, 2)
    text = spec.read_text()
    old = '[sink]\nkind = "jsonl"\npath = "out"'
    assert old in text
    spec.write_text(text.replace(old, f'[sink]\nkind = "kafka"\nbootstrap = "{bootstrap}"\n'
                                      f'topic = "{topic}"\npath = "staging-out"'))
    return topic


def _spec(d: Path, bootstrap: str, source_topic: str | None = None) -> tuple[Path, str]:
    d.mkdir(parents=True, exist_ok=True)
    names = make_input(d, events=EVENTS, bad_every=97)
    spec = write_spec(d, names, **SPEC)
    if source_topic is not None:
        kafka_source_spec(spec, bootstrap, source_topic)
    return spec, _kafka_results(spec, bootstrap)


def _job(spec: Path, workers: int | None, **kw: Any) -> Any:
    from sealstream import Job, load_spec
    from sealstream.distributed import DistributedJob

    if workers is None:
        return Job(load_spec(spec), **kw)
    return DistributedJob(load_spec(spec), workers=workers, **kw)


def _records(bootstrap: str, topic: str) -> list[dict[str, Any]]:
    out = []
    for m in read_committed(bootstrap, topic):
        headers = dict(m.headers)
        out.append({"partition": m.partition, "key": m.key, "value": json.loads(m.value),
                    "id": headers["sealstream-id"],
                    "token": headers["sealstream-token"].decode()})
    return out


def _assert_same_records(got: list[dict[str, Any]], want: list[dict[str, Any]]) -> None:
    """The same multiset of (partition, key, identity), each with one process's value
    (floats within 1e-9), and per partition each key's records in the same order."""
    def ident(r: dict[str, Any]) -> tuple[Any, ...]:
        return (r["partition"], r["key"], r["id"])

    assert Counter(map(ident, got)) == Counter(map(ident, want))
    assert len(set(map(ident, got))) == len(got), "a record twice"
    by_id = {ident(r): r["value"] for r in want}
    for r in got:
        exp = by_id[ident(r)]
        assert r["value"].keys() == exp.keys()
        for k, v in r["value"].items():
            e = exp[k]
            if isinstance(e, float) and isinstance(v, float):
                assert math.isclose(v, e, rel_tol=1e-9, abs_tol=1e-12), (k, v, e)
            else:
                assert type(v) is type(e) and v == e, (k, v, e)

    def per_key(rs: list[dict[str, Any]]) -> dict[tuple[int, bytes], list[bytes]]:
        out: dict[tuple[int, bytes], list[bytes]] = {}
        for r in rs:  # read_committed: partition then offset order
            out.setdefault((r["partition"], r["key"]), []).append(r["id"])
        return out

    assert per_key(got) == per_key(want)


def _workers_of(records: list[dict[str, Any]]) -> set[int]:
    """The worker indexes whose tokens the records carry (-1: a token of the
    coordinator's own)."""
    out = set()
    for r in records:
        m = WORKER_TOKEN.fullmatch(r["token"])
        out.add(int(m.group(1)) if m else -1)
    return out


@pytest.fixture(scope="module")
def reference(kafka: Any, tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """One process's results of the bounded story, as a read_committed consumer sees
    them."""
    spec, topic = _spec(tmp_path_factory.mktemp("kafka-out-ref"), kafka.bootstrap)
    _job(spec, None).run()
    got = _records(kafka.bootstrap, topic)
    assert len(got) > 100
    return got


def test_two_workers_produce_one_process_records_and_no_row_crosses_the_coordinator(
        ray_cluster: Any, kafka: Any, reference: list[dict[str, Any]],
        tmp_path: Path) -> None:
    """2 workers on the bounded story: the topic holds one process's records, produced
    by both workers' transactions (none by the coordinator), and the coordinator
    received no result row (``output_bytes`` 0: it received every fired window when it
    produced them itself)."""
    from sealstream.distributed._steps import StepPlanner

    spec, topic = _spec(tmp_path, kafka.bootstrap)
    job = _job(spec, 2)
    job.run()
    assert isinstance(job.merger, StepPlanner)
    assert job.counters.results_written == len(reference)
    assert sum(job.merger.output_bytes) == 0
    got = _records(kafka.bootstrap, topic)
    _assert_same_records(got, reference)
    assert _workers_of(got) == {0, 1}
    staging = list((tmp_path / "staging-out").rglob(".part-*"))
    assert staging == [], staging


def test_a_kafka_source_job_with_workers_equals_one_process(
        ray_cluster: Any, kafka: Any, tmp_path: Path) -> None:
    """A 3-partition Kafka topic read by 2 workers, results produced by each worker's
    own transactions: the same records as one process reading the same topic, no
    result row through the coordinator."""
    from sealstream.distributed.live import LivePlanner

    names = make_input(tmp_path / "input", events=EVENTS, bad_every=97)
    source = produce_input(kafka.bootstrap, tmp_path / "input", names)
    ref_spec, ref_topic = _spec(tmp_path / "one", kafka.bootstrap, source)
    _job(ref_spec, None).run()
    want = _records(kafka.bootstrap, ref_topic)
    spec, topic = _spec(tmp_path / "two", kafka.bootstrap, source)
    job = _job(spec, 2)
    job.run()
    assert isinstance(job.merger, LivePlanner)
    assert sum(job.merger.output_bytes) == 0
    got = _records(kafka.bootstrap, topic)
    assert len(want) > 100
    _assert_same_records(got, want)
    assert _workers_of(got) == {0, 1}


def test_late_events_and_bad_records_are_produced_by_the_reading_workers(
        ray_cluster: Any, kafka: Any, tmp_path: Path) -> None:
    """Results, late events and bad records into three topics, 2 workers: each topic
    holds one process's records, produced by both workers' own transactions (late
    events and bad records by the worker that reads their partition), and no output
    row crosses the coordinator (it received the late events and bad records when it
    produced them)."""
    from _kafka_story import OUTPUTS, kafka_spec

    from sealstream.distributed._steps import StepPlanner

    specs: dict[str, Path] = {}
    topics: dict[str, dict[str, str]] = {}
    for label in ("one", "two"):
        d = tmp_path / label
        d.mkdir()
        specs[label] = write_spec(d, make_input(d, events=EVENTS, bad_every=97), **SPEC)
        topics[label] = kafka_spec(specs[label], kafka.bootstrap)
    _job(specs["one"], None).run()
    job = _job(specs["two"], 2)
    job.run()
    assert isinstance(job.merger, StepPlanner)
    assert job.counters.late_events > 0 and job.counters.bad_records > 0
    assert sum(job.merger.output_bytes) == 0
    for section, _, _ in OUTPUTS:
        want = _records(kafka.bootstrap, topics["one"][section])
        got = _records(kafka.bootstrap, topics["two"][section])
        assert want, section
        _assert_same_records(got, want)
        assert _workers_of(got) == {0, 1}, section


def _descendants(root: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(name))
    found: set[int] = set()
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def _stopped(pids: set[int]) -> list[int]:
    out = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "T":
                    out.append(pid)
        except OSError:
            continue
    return sorted(out)


def _uncommitted_tokens(bootstrap: str, topic: str) -> set[str]:
    """The tokens of every message of ``topic``, committed or not (read_uncommitted)."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"t-{uuid.uuid4().hex}",
                  "isolation.level": "read_uncommitted", "enable.partition.eof": True,
                  "auto.offset.reset": "earliest", "enable.auto.commit": False})
    try:
        assign = [TopicPartition(topic, p, 0) for p in (0, 1)]
        ends = {tp.partition: c.get_watermark_offsets(tp, timeout=30, cached=False)[1]
                for tp in assign}
        pending = {p for p, hi in ends.items() if hi > 0}
        c.assign(assign)
        tokens: set[str] = set()
        deadline = time.monotonic() + 120
        while pending and time.monotonic() < deadline:
            for m in c.consume(1000, 0.5):
                if m.error() is not None:
                    if m.error().code() == KafkaError._PARTITION_EOF:
                        pending.discard(m.partition())
                    continue
                tokens.add(dict(m.headers())["sealstream-token"].decode())
                if m.offset() + 1 >= ends[m.partition()]:
                    pending.discard(m.partition())
        assert not pending, "the topic was not read to its end"
        return tokens
    finally:
        c.close()


def test_a_worker_sigkilled_inside_its_transaction_is_exactly_once_after_restart(
        kafka: Any, reference: list[dict[str, Any]], tmp_path: Path) -> None:
    """``run --workers 2`` (its own local Ray, so that the workers inherit
    ``SEALSTREAM_PAUSE_AT``): the first worker to commit stops itself inside its first
    transaction, its rows produced and flushed to the broker, not committed; it is
    SIGKILLed there. The job restarts every worker from the newest checkpoint, whose
    manifest names that epoch's tokens: recovery fences both worker producers (the
    broker aborts the open transaction), finds the tokens missing and produces them.
    Every later stop at the same point (the restarted workers, the coordinator's
    recovery) is let go on. The topic then holds one process's records exactly once."""
    spec, topic = _spec(tmp_path, kafka.bootstrap)
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS",
                                                            "SEALSTREAM_CRASH_AT")}
    env["SEALSTREAM_PAUSE_AT"] = "kafka_in_transaction:1"
    log = tmp_path / "run.log"
    with open(log, "w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "sealstream", "run", str(spec), "--quiet",
             "--workers", "2"], stdout=subprocess.DEVNULL, stderr=err, env=env)
    killed: int | None = None
    try:
        deadline = time.monotonic() + 600
        while proc.poll() is None and time.monotonic() < deadline:
            stopped = [p for p in _stopped(_descendants(proc.pid) | {proc.pid})]
            if stopped and killed is None:
                victim = stopped[0]
                assert victim != proc.pid, "the coordinator paused before any worker"
                in_flight = _uncommitted_tokens(kafka.bootstrap, topic)
                assert any(WORKER_TOKEN.fullmatch(t) for t in in_flight), in_flight
                os.kill(victim, signal.SIGKILL)
                killed = victim
            else:
                for pid in stopped:
                    os.kill(pid, signal.SIGCONT)
            time.sleep(0.1)
        assert proc.poll() is not None, "the run did not end"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = log.read_text()
    assert killed is not None, text
    assert proc.returncode == 0, text
    assert "restarting every worker from the newest atomic checkpoint" in text, text
    _assert_same_records(_records(kafka.bootstrap, topic), reference)


def _killed_at(spec: Path, point: str, address: str, workers: int) -> None:
    env = dict(os.environ, SEALSTREAM_CRASH_AT=point)
    proc = subprocess.run(
        [sys.executable, "-m", "sealstream", "run", str(spec), "--quiet",
         "--workers", str(workers), "--ray", address],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env, timeout=600)
    assert proc.returncode == -signal.SIGKILL, f"not killed at {point}: {proc.stderr}"


@pytest.mark.parametrize(("before", "after"), [(2, 3), (3, 2), (3, 1)])
def test_rescaled_between_the_manifest_and_the_worker_commits_stays_exactly_once(
        ray_cluster: Any, kafka: Any, reference: list[dict[str, Any]], tmp_path: Path,
        before: int, after: int) -> None:
    """``run --workers N`` SIGKILLs itself after worker 0 committed an epoch's
    transaction (the manifest names every worker's token, the others are staged);
    meanwhile a zombie producer of the highest old index holds an open transaction.
    ``--workers M`` (M = 1: one process) resumes: the zombie is fenced (its commit
    fails, its row is never visible), the staged epochs of the old indexes (``w2`` when
    3 -> 2) are produced by the coordinator's recovery, and the topic holds one
    process's records exactly once; with 3 workers the third worker produces its own."""
    from confluent_kafka import KafkaException, Producer

    spec, topic = _spec(tmp_path, kafka.bootstrap)
    _killed_at(spec, "after_commit_worker_part:1", ray_cluster.address, before)
    staged = sorted(p.name for p in (tmp_path / "staging-out").rglob(".part-*.arrow"))
    assert staged and all(WORKER_TOKEN.search(n) for n in staged), staged
    zombie = Producer({"bootstrap.servers": kafka.bootstrap,
                       "transactional.id": f"sealstream-story-results-w{before - 1}"})
    zombie.init_transactions(30)
    zombie.begin_transaction()
    zombie.produce(topic, b'{"zombie": true}', b"zombie")
    assert zombie.flush(30) == 0
    job = _job(spec, after if after > 1 else None)
    job.run()
    assert job.resumed_from is not None
    with pytest.raises(KafkaException):
        zombie.commit_transaction(30)
    got = _records(kafka.bootstrap, topic)
    _assert_same_records(got, reference)
    if after == 3:
        assert 2 in _workers_of(got)
    assert list((tmp_path / "staging-out").rglob(".part-*")) == []
