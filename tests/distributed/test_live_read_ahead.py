"""Read-ahead of a live source on the data plane (:mod:`sealstream.distributed._live_read`):
each Kafka partition's owner polls (fetches and parses) its next records on a thread
of its own while the current step is planned and aggregated. It holds at most one
poll ahead, hands out exactly the planned ranges (a seek drops what it read ahead),
and a worker SIGKILLed while it holds records read ahead loses nothing."""

from __future__ import annotations

import random
import time
import uuid
from pathlib import Path
from typing import Any

from _live_case import (
    BATCH,
    LiveStory,
    assert_same_output,
    kafka_source_spec,
    live_job,
    live_spec,
    make_input,
    produce_input,
    write_spec,
)

WAIT_S = 120  # generous: the machine is shared and loaded


def _settled(reader: Any, q: int) -> tuple[int, int]:
    """What partition ``q`` holds once its read-ahead poll (if any) is done."""
    deadline = time.monotonic() + WAIT_S
    while True:
        pending, ahead = reader.held_records()[q]
        if ahead is not None:
            return pending, ahead
        assert time.monotonic() < deadline, "the read-ahead poll never finished"
        time.sleep(0.01)  # polling for a state, not a timer


def _reader(kafka: Any, tmp_path: Path, names: list[str], topic: str) -> Any:
    """A worker's live reader of ``topic`` (the story's spec, reading it)."""
    from sealstream import load_spec
    from sealstream.distributed._live_read import LiveReader

    spec = write_spec(tmp_path, names, batch_size=BATCH)
    kafka_source_spec(spec, kafka.bootstrap, topic)
    return LiveReader(load_spec(spec))


def _produce_lines(kafka: Any, tmp_path: Path, name: str, topic: str,
                   partition: int) -> list[str]:
    """The input file ``name``'s lines, produced into ``partition`` of ``topic``."""
    from confluent_kafka import Producer

    prod = Producer({"bootstrap.servers": kafka.bootstrap})
    lines = [x for x in (tmp_path / name).read_text().splitlines() if x]
    for line in lines:
        prod.produce(topic, line.encode(), partition=partition)
    assert prod.flush(60) == 0
    return lines


def test_read_ahead_is_one_poll_and_hands_out_exactly_the_ranges(
        kafka: Any, tmp_path: Path) -> None:
    """A partition read step by step as the coordinator plans it: after every report
    it holds at most the reported poll plus one poll read ahead (``max_records``
    each), later reports are served by the read-ahead, the ranges taken are every
    record once in order; a seek back (a replay) drops the read-ahead and hands out
    the recorded range again, exactly."""
    from sealstream.sources._base import OFFSET

    names = make_input(tmp_path, partitions=1, events=500, bad_every=53)
    topic = produce_input(kafka.bootstrap, tmp_path, names)
    reader = _reader(kafka, tmp_path, names, topic)
    name = f"{topic}/0"
    try:
        assert reader.open(0, name, None, True) == 0
        end = reader.end(0)
        assert end is not None and end > 500  # the events and the bad lines
        taken: list[int] = []
        served_ahead = 0
        nxt = 0
        deadline = time.monotonic() + WAIT_S
        while nxt < end:
            assert time.monotonic() < deadline, f"stuck at {nxt}"
            before = reader.held_records()[0]
            after, first, last = reader.poll(0, BATCH, 0)
            if first is None and after == nxt:
                reader.poll(0, BATCH, 200)  # nothing at hand yet: wait, as the planner does
                continue
            if before[1]:  # the report was the poll read ahead
                served_ahead += 1
            pending, ahead = _settled(reader, 0)
            assert pending <= BATCH and ahead <= BATCH, (pending, ahead)
            assert last is not None and last < after <= nxt + BATCH
            events, bad, _ = reader.take(0, name, nxt, after, BATCH, 100)
            taken += events[OFFSET].to_list() + bad["_offset"].to_list()
            nxt = after
        assert sorted(taken) == list(range(end)) and len(taken) == end
        assert served_ahead >= 3, served_ahead
        # a replay of recorded steps from an earlier position while records are held
        # and read ahead: both are dropped, the ranges are handed out again, exactly
        reader.seek(0, 100)
        after, first, _ = reader.poll(0, BATCH, 0)
        while first is None:
            assert time.monotonic() < deadline, "nothing polled after the seek"
            after, first, _ = reader.poll(0, BATCH, 200)
        assert first == 100
        while _settled(reader, 0)[1] == 0:  # a read-ahead that delivered records
            assert time.monotonic() < deadline, "nothing read ahead after the seek"
            reader.take(0, name, 100, after, BATCH, 100)
            reader.seek(0, 100)
            after, first, _ = reader.poll(0, BATCH, 200)
        for frm, to in ((0, 50), (50, 150), (150, 151)):
            events, bad, _ = reader.take(0, name, frm, to, BATCH, 100)
            got = events[OFFSET].to_list() + bad["_offset"].to_list()
            assert sorted(got) == list(range(frm, to)), (frm, to)
    finally:
        reader.close()
    assert reader.held == {} and reader._pool is None


def test_a_read_ahead_waits_for_records_that_come_later(kafka: Any, tmp_path: Path) -> None:
    """A partition opened before it has records starts its read-ahead at once, and
    that read-ahead waits for the client's fetch instead of handing back an empty
    poll: the records produced later are held ahead without any report, and the
    first report is served by them (not by a poll on the actor's thread). A
    read-ahead still waiting holds nothing, and gives up as soon as a poll is
    wanted."""
    from sealstream.testing.brokers import create_topic

    names = make_input(tmp_path, partitions=1, events=300)
    topic = f"later-{uuid.uuid4().hex[:12]}"
    create_topic(kafka.bootstrap, topic, 1)
    reader = _reader(kafka, tmp_path, names, topic)
    name = f"{topic}/0"
    try:
        assert reader.open(0, name, None, True) == 0
        assert _settled(reader, 0) == (0, 0)  # waiting, holding nothing
        # nothing there: a report wanted now ends the wait, empty
        assert reader.poll(0, BATCH, 0) == (0, None, None)
        _produce_lines(kafka, tmp_path, names[0], topic, 0)
        deadline = time.monotonic() + WAIT_S
        while not reader.held_records()[0][1]:  # the read-ahead alone takes them
            assert time.monotonic() < deadline, "the read-ahead gave up waiting"
            time.sleep(0.01)  # polling for a state, not a timer
        ahead = reader.held_records()[0][1]
        assert ahead is not None and 0 < ahead <= BATCH
        after, first, last = reader.poll(0, BATCH, 0)
        assert first == 0 and last is not None and after == last + 1
        assert after >= ahead  # served by the read-ahead (topped up with what came since)
    finally:
        reader.close()
    assert reader.held == {} and reader._pool is None


def test_idle_partitions_do_not_hold_back_the_others(kafka: Any, tmp_path: Path) -> None:
    """More partitions than read-ahead threads, all idle but the last: the idle ones'
    read-aheads wait for records (each at most READ_AHEAD_WAIT_S), and a report of a
    partition whose read-ahead has not started yet polls at once instead of waiting
    behind them; every report is answered and the last partition's records are
    handed out exactly."""
    from sealstream.distributed._live_read import READ_AHEAD_THREADS
    from sealstream.sources._base import OFFSET
    from sealstream.testing.brokers import create_topic

    parts = READ_AHEAD_THREADS + 2
    names = make_input(tmp_path, partitions=1, events=200)
    topic = f"idle-{uuid.uuid4().hex[:12]}"
    create_topic(kafka.bootstrap, topic, parts)
    lines = _produce_lines(kafka, tmp_path, names[0], topic, parts - 1)
    reader = _reader(kafka, tmp_path, names, topic)
    last = parts - 1
    try:
        for q in range(parts):
            assert reader.open(q, f"{topic}/{q}", None, True) == 0
        taken: list[int] = []
        deadline = time.monotonic() + WAIT_S
        while len(taken) < len(lines):
            assert time.monotonic() < deadline, taken[-1:]
            # the last partition first: its read-ahead is queued behind the idle ones'
            reports = [reader.poll(q, BATCH, 0) for q in reversed(range(parts))][::-1]
            assert all(r == (0, None, None) for r in reports[:last]), reports
            after, first, _ = reports[last]
            if first is None:
                reader.poll(last, BATCH, 200)  # nothing at hand yet: wait, as the planner does
                continue
            events, bad, _ = reader.take(last, f"{topic}/{last}", len(taken), after, BATCH, 100)
            taken += events[OFFSET].to_list() + bad["_offset"].to_list()
        assert sorted(taken) == list(range(len(lines)))
    finally:
        reader.close()
    assert reader.held == {} and reader._pool is None


class _KillHoldingWorker:
    """A progress hook: from a randomly drawn step on, SIGKILL the first worker seen
    holding records read ahead (asked between steps, while its read-ahead polls);
    before that, check every worker's read-ahead stays within one poll."""

    def __init__(self, rng: random.Random) -> None:
        self.at, self.step = rng.randrange(2, 5), 0
        self.killed: list[tuple[int, dict[int, tuple[int, int | None]]]] = []
        self.most = 0

    def __call__(self, job: Any) -> None:
        import os
        import signal

        import ray

        self.step += 1
        op = job.operator
        if self.killed or not getattr(op, "actors", None):
            return
        deadline = time.monotonic() + WAIT_S
        while True:  # wait for the read-ahead polls in flight (a state, not a timer)
            held = ray.get([a.live_held.remote() for a in op.actors], timeout=WAIT_S)
            if all(ahead is not None for h in held for _, ahead in h.values()):
                break
            assert time.monotonic() < deadline, held
            time.sleep(0.01)
        for h in held:
            for pending, ahead in h.values():
                assert ahead is not None and pending <= BATCH and ahead <= BATCH, held
                self.most = max(self.most, ahead)
        if self.step < self.at:
            return
        for pid, h in zip(op.pids, held, strict=True):
            if any(ahead for _, ahead in h.values()):
                os.kill(pid, signal.SIGKILL)
                self.killed.append((pid, h))
                return


def test_a_worker_killed_holding_read_ahead_records_loses_nothing(
        ray_cluster: Any, kafka: Any, live_story: LiveStory, tmp_path: Path) -> None:
    """2 workers; one is SIGKILLed while it holds a poll read ahead (records in no
    step yet): every worker restarts from the newest checkpoint, and the results,
    late events and bad records are one process's, exactly once."""
    spec = live_spec(tmp_path, kafka.bootstrap, live_story)
    kill = _KillHoldingWorker(random.Random(5))
    job = live_job(spec, 2, progress=kill)
    job.run()
    assert kill.killed, "no worker was seen holding records read ahead"
    assert job.restarts == 1
    assert 0 < kill.most <= BATCH
    assert_same_output(tmp_path, live_story.dir)
