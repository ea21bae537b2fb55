"""Reading ahead (``sources/_kafka_prefetch``): a Kafka partition fetches and parses
its next chunks on a thread of its own while the run works on the previous one.
Off by default (``SEALSTREAM_KAFKA_PREFETCH``); these tests turn it on.
Against a real broker: the queue fills up to its bound and no further; positions
stay those of what was handed out; a seek drops what was read ahead; a broker lost
while the thread fetches fails with the same one line, at the same offset, once
fail_after_ms has passed; a run SIGKILLed while its partitions hold records read
ahead resumes exactly once."""

from __future__ import annotations

import re
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from test_kafka_runs import (
    _drain,
    _finish,
    _start,
    _wait_line,
    file_source,
    kafka_source,
    produce_lines,
    results,
    run,
    write_spec,
)
from test_kafka_source import PLAN, _event, produce

from sealstream.errors import SourceUnavailableError, SpecError
from sealstream.sources._kafka_prefetch import PREFETCH_DEPTH, PREFETCH_ENV
from sealstream.sources.kafka import KafkaPartition, KafkaSettings, KafkaSource
from sealstream.testing.datagen import generate

ck = pytest.importorskip("confluent_kafka")


def _wait_for(cond: Any, what: str, limit_s: float = 90.0) -> None:
    deadline = time.monotonic() + limit_s
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def _first_chunk(part: KafkaPartition, n: int) -> list[int]:
    deadline = time.monotonic() + 90
    while True:
        c = part.poll(n, 200)
        assert c is not None
        if c.events.height:
            return list(c.events["__off"].to_list())
        assert time.monotonic() < deadline, "nothing delivered"


def _prefetch_threads(name: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == f"sealstream-prefetch {name}"]


def test_reads_ahead_within_its_bound_positions_stay_what_was_handed_out(kafka: Any) -> None:
    topic = kafka.new_topic(partitions=1)
    produce(kafka.bootstrap, topic, [_event(i) for i in range(3000)])
    src = KafkaSource(KafkaSettings(kafka.bootstrap, topic), PLAN)
    assert src.prefetch == 0  # off unless SEALSTREAM_KAFKA_PREFETCH turns it on
    src.prefetch = PREFETCH_DEPTH
    src.discover()
    name = f"{topic}/0"
    part = src.open(name, None)
    ahead = part.prefetcher
    assert ahead is not None and ahead.depth == PREFETCH_DEPTH
    got = _first_chunk(part, 100)
    assert got == list(range(len(got))) and len(got) <= 100
    # the caller does nothing: the thread fills the queue to its bound and waits there
    _wait_for(lambda: ahead.waiting_full, "the read-ahead queue to be full")
    assert part.prefetched() == PREFETCH_DEPTH and ahead.peak == PREFETCH_DEPTH
    # records read ahead are nobody's: the position is after what was handed out
    assert part.position == part.tell() == len(got)
    # a seek drops them and reads from the new position
    part.seek(1000)
    assert part.prefetched() == 0 and part.position == 1000
    seen: list[int] = []
    deadline = time.monotonic() + 90
    while part.position < 3000:
        assert time.monotonic() < deadline, f"stuck at {part.position}"
        c = part.poll(100, 200)
        assert c is not None and c.events.height <= 100
        seen += c.events["__off"].to_list()
        assert part.prefetched() <= PREFETCH_DEPTH
    assert seen == list(range(1000, 3000))
    assert part.prefetcher is not None and part.prefetcher.peak <= PREFETCH_DEPTH
    assert _prefetch_threads(name)
    part.close()
    src.close()
    assert not _prefetch_threads(name)  # close ends the thread before the consumer


def test_broker_killed_while_reading_ahead_fails_with_the_same_line(own_kafka: Any) -> None:
    """Records fetched before the broker went away are handed out in order; then
    the bounded retry ends with the one line of a run without read-ahead, naming
    the address and the offset after the last record handed out."""
    topic = own_kafka.new_topic(partitions=1)
    produce(own_kafka.bootstrap, topic, [_event(i) for i in range(2000)])
    src = KafkaSource(KafkaSettings(own_kafka.bootstrap, topic, fail_after_ms=2_000), PLAN)
    src.prefetch = PREFETCH_DEPTH
    src.discover()
    part = src.open(f"{topic}/0", None)
    seen = _first_chunk(part, 50)
    ahead = part.prefetcher
    assert ahead is not None
    _wait_for(lambda: ahead.waiting_full, "the read-ahead queue to be full")
    own_kafka.broker.kill()
    started = time.monotonic()
    deadline = started + 120
    with pytest.raises(SourceUnavailableError) as err:  # noqa: PT012
        while True:
            assert time.monotonic() < deadline, "no error after the broker was killed"
            c = part.poll(50, 100)
            assert c is not None
            seen += c.events["__off"].to_list()
    assert time.monotonic() - started >= 2.0  # retried for fail_after_ms first
    assert seen == list(range(len(seen)))  # nothing lost or repeated before the error
    msg = str(err.value)
    assert "\n" not in msg
    assert re.fullmatch(
        rf"kafka broker {re.escape(own_kafka.bootstrap)} unreachable for [0-9.]+ s "
        rf"\(reading {re.escape(topic)}/0 at offset {part.position}; "
        r"fail_after_ms = 2000\): .+", msg), msg
    with pytest.raises(SourceUnavailableError):  # and it stays failed
        part.poll(50, 0)
    part.close()
    src.close()


def test_sigkill_while_partitions_hold_records_read_ahead_resumes_exactly_once(
        kafka: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A backlog many times the batch size: while the engine works on a step, each
    partition's queue holds the next chunks. SIGKILLs after checkpoints, then a
    stop = "end" run: the results equal those of the same events in files, each
    window once (records read ahead were committed nowhere)."""
    monkeypatch.setenv(PREFETCH_ENV, "1")  # the runs (subprocesses) read ahead
    files = generate(tmp_path / "data", events=30000, keys=40, partitions=3, seed=11)
    topic = kafka.new_topic(partitions=3)
    produce_lines(kafka.bootstrap, topic, files)
    d = tmp_path / "run"
    never = write_spec(d, kafka_source(kafka.bootstrap, topic, stop="never"))
    never.write_text(never.read_text().replace(
        'name = "kafka_story"', 'name = "kafka_story"\nbatch_size = 300'))
    for k in (1, 2):
        proc = _start(never)
        # killed after its k-th checkpoint of this process: mid-backlog (30,000
        # events in steps of at most 300 per partition)
        seen = {"n": 0}

        def kth(ev: dict[str, Any], seen: dict[str, int] = seen, k: int = k) -> bool:
            if ev.get("event") == "checkpoint":
                seen["n"] += 1
            return seen["n"] >= k

        _wait_line(proc, kth)
        proc.send_signal(signal.SIGKILL)
        drain = _drain(proc)
        assert _finish(proc, drain) == -signal.SIGKILL
    end = write_spec(d, kafka_source(kafka.bootstrap, topic, stop="end"), name="end.toml")
    r = run(end, timeout=600)
    assert r.returncode == 0, r.stderr
    ref = tmp_path / "ref"
    assert run(write_spec(ref, file_source(files)), timeout=600).returncode == 0
    got = results(d)
    assert len(got) == len({g[:3] for g in got})  # exactly once
    assert got == results(ref)


def test_the_setting_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PREFETCH_ENV, "two")
    with pytest.raises(SpecError, match=f"{PREFETCH_ENV}: 'two' is not a number of chunks"):
        KafkaSource(KafkaSettings("127.0.0.1:1", "t"), PLAN)
    monkeypatch.setenv(PREFETCH_ENV, "1")
    assert KafkaSource(KafkaSettings("127.0.0.1:1", "t"), PLAN).prefetch == 1


def test_sigterm_with_read_ahead_on_stops_cleanly_and_resumes(
        kafka: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SIGTERM while the partitions read ahead: the run ends with its final
    checkpoint (exit 0; the threads stop, the consumers close); a stop = "end" run
    then gives the results of the same events in files."""
    monkeypatch.setenv(PREFETCH_ENV, "1")
    files = generate(tmp_path / "data", events=20000, keys=20, partitions=2, seed=5)
    topic = kafka.new_topic(partitions=2)
    produce_lines(kafka.bootstrap, topic, files)
    d = tmp_path / "run"
    never = write_spec(d, kafka_source(kafka.bootstrap, topic, stop="never"))
    never.write_text(never.read_text().replace(
        'name = "kafka_story"', 'name = "kafka_story"\nbatch_size = 500'))
    proc = _start(never)
    _wait_line(proc, lambda ev: ev.get("event") == "checkpoint")
    proc.send_signal(signal.SIGTERM)
    drain = _drain(proc)
    assert _finish(proc, drain) == 0
    end = write_spec(d, kafka_source(kafka.bootstrap, topic, stop="end"), name="end.toml")
    r = run(end, timeout=600)
    assert r.returncode == 0, r.stderr
    ref = tmp_path / "ref"
    assert run(write_spec(ref, file_source(files)), timeout=600).returncode == 0
    got = results(d)
    assert len(got) == len({g[:3] for g in got})
    assert got == results(ref)
