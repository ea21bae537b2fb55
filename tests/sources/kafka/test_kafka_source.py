"""The Kafka source against a real Kafka-protocol broker: positions, start modes,
keys and broker timestamps, malformed messages, transactions, partition growth and
disappearance, expiry, broker faults, group positions."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from sealstream.errors import SourceError, SourceExpiredError, SourceUnavailableError, SpecError
from sealstream.sources import FieldPlan
from sealstream.sources._base import Chunk
from sealstream.sources._live import LivePartition, LiveSource
from sealstream.sources.kafka import KafkaPartition, KafkaSettings, KafkaSource

ck = pytest.importorskip("confluent_kafka")
PLAN = FieldPlan(key="user", time="ts", fields={"amount": "numeric"})


def _event(i: int, user: str | None = None) -> bytes:
    return json.dumps({"user": user or f"u{i % 3}", "ts": 1_000 * i, "amount": i}).encode()


def produce(bootstrap: str, topic: str, values: list[bytes | None], partition: int = 0,
            keys: list[bytes | None] | None = None,
            timestamps: list[int] | None = None) -> None:
    p = ck.Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for n, v in enumerate(values):
        kw: dict[str, Any] = {"partition": partition}
        if keys is not None:
            kw["key"] = keys[n]
        if timestamps is not None:
            kw["timestamp"] = timestamps[n]
        p.produce(topic, v, **kw)
    assert p.flush(30) == 0


def read_all(part: KafkaPartition, until: int, max_records: int = 1000,
             limit_s: float = 60.0) -> list[Chunk]:
    """Poll until the position reaches ``until`` (a deadline only guards a hang)."""
    chunks: list[Chunk] = []
    deadline = time.monotonic() + limit_s
    while part.position < until:
        assert time.monotonic() < deadline, f"stuck at {part.position} (want {until})"
        c = part.poll(max_records, 200)
        assert c is not None
        chunks.append(c)
    return chunks


def offsets(chunks: list[Chunk]) -> list[int]:
    return [o for c in chunks for o in c.events["__off"].to_list()]


def bad_offsets(chunks: list[Chunk]) -> list[int]:
    return [o for c in chunks for o in c.bad["_offset"].to_list()]


@pytest.fixture
def source(kafka: Any) -> Iterator[tuple[Any, str]]:
    yield kafka, kafka.new_topic(partitions=2)


def _open(bootstrap: str, topic: str, plan: FieldPlan = PLAN,
          **kw: Any) -> KafkaSource:
    return KafkaSource(KafkaSettings(bootstrap, topic, **kw), plan)


def test_positions_values_and_bad_messages(source: tuple[Any, str]) -> None:
    kafka, topic = source
    vals: list[bytes | None] = [_event(i) for i in range(5)]
    vals += [b"not json", None, b"  ", b'{"user": "x"}', b'{"user":\n"y", "ts": 9}', b"[1]"]
    produce(kafka.bootstrap, topic, vals)
    src = _open(kafka.bootstrap, topic)
    assert isinstance(src, LiveSource)
    assert src.discover() == [f"{topic}/0", f"{topic}/1"]
    part = src.open(f"{topic}/0", None)
    assert isinstance(part, LivePartition)
    assert (part.earliest(), part.end()) == (0, 11)
    chunks = read_all(part, 11, max_records=4)
    assert offsets(chunks) == [0, 1, 2, 3, 4, 9]
    assert bad_offsets(chunks) == [5, 6, 7, 8, 10]
    bad = {o: r for c in chunks for o, r in zip(c.bad["_offset"], c.bad["_reason"], strict=True)}
    assert "missing time field 'ts'" in bad[8]
    assert all(c.bad["_line"].to_list() == c.bad["_offset"].to_list() for c in chunks)
    assert chunks[-1].position.offset == 11 and part.lag() == 0
    # nothing yet: an empty chunk, not None
    nothing = part.poll(10, 50)
    assert nothing is not None and nothing.last_offset is None and nothing.events.height == 0
    # the raw text of events is looked up by offset
    first = chunks[0]
    assert first.raw is not None
    assert json.loads(first.raw.texts(first.events["__off"].to_numpy()[:1])[0])["amount"] == 0
    part.seek(3)
    again = read_all(part, 11)
    assert offsets(again) == [3, 4, 9]
    part.close()
    src.close()


def test_transaction_markers_and_aborted_records_are_gaps(source: tuple[Any, str]) -> None:
    kafka, topic = source
    p = ck.Producer({"bootstrap.servers": kafka.bootstrap, "transactional.id": f"tx-{topic}"})
    p.init_transactions(30)
    for n, commit in enumerate([True, False, True]):
        p.begin_transaction()
        for i in range(3):
            p.produce(topic, _event(10 * n + i), partition=0)
        if commit:
            p.commit_transaction(30)
        else:
            p.abort_transaction(30)
    src = _open(kafka.bootstrap, topic)
    src.discover()
    part = src.open(f"{topic}/0", None)
    end = part.end()
    assert end is not None and end > 6  # 6 committed records and the markers
    chunks = read_all(part, end, max_records=2)
    got = [json.loads(t)["amount"] for c in chunks if c.raw is not None
           for t in c.raw.texts(c.events["__off"].to_numpy())]
    assert got == [0, 1, 2, 20, 21, 22]
    assert part.position == end
    part.close()
    src.close()


def test_start_modes_keys_and_broker_timestamps(source: tuple[Any, str]) -> None:
    kafka, topic = source
    produce(kafka.bootstrap, topic, [_event(i) for i in range(6)], partition=1,
            keys=[b"a", b"b", None, b"c", b"d", b"e"],
            timestamps=[5_000, 6_000, 7_000, 8_000, 9_000, 10_000])
    name = f"{topic}/1"
    plan = FieldPlan(key="@key", time="@timestamp", fields={"amount": "numeric"})
    src = _open(kafka.bootstrap, topic, plan)
    src.discover()
    part = src.open(name, None)
    chunks = read_all(part, 6)
    ev = chunks[0].events if len(chunks) == 1 else None
    assert offsets(chunks) == [0, 1, 3, 4, 5]
    assert bad_offsets(chunks) == [2]
    if ev is not None:
        assert ev["__key"].to_list() == ["a", "b", "c", "d", "e"]
        assert ev["__t"].to_list() == [5_000, 6_000, 8_000, 9_000, 10_000]
    part.close()
    src.close()
    latest = _open(kafka.bootstrap, topic, start="latest")
    latest.discover()
    assert latest.open(name, None).position == 6
    by_time = _open(kafka.bootstrap, topic, start="time", start_time_ms=7_500)
    by_time.discover()
    assert by_time.open(name, None).position == 3
    after = _open(kafka.bootstrap, topic, start="time", start_time_ms=99_000)
    after.discover()
    assert after.open(name, None).position == 6
    for s in (latest, by_time, after):
        s.close()


def test_settings_are_checked() -> None:
    with pytest.raises(SpecError, match="start = 'soon'"):
        KafkaSettings("h:1", "t", start="soon")  # type: ignore[arg-type]
    with pytest.raises(SpecError, match="start_time_ms"):
        KafkaSettings("h:1", "t", start="time")
    with pytest.raises(SpecError, match="isolation.level"):
        KafkaSettings("h:1", "t", client={"isolation.level": "read_uncommitted"})


def test_growth_is_read_from_the_start_and_a_deleted_topic_stops(source: tuple[Any, str]) -> None:
    kafka, topic = source
    from confluent_kafka.admin import AdminClient, NewPartitions

    src = _open(kafka.bootstrap, topic, start="latest")
    assert src.discover() == [f"{topic}/0", f"{topic}/1"]
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
    for f in admin.create_partitions([NewPartitions(topic, 3)]).values():
        f.result(30)
    produce(kafka.bootstrap, topic, [_event(i) for i in range(3)], partition=2)
    deadline = time.monotonic() + 30
    while len(names := src.discover()) < 3:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert names[-1] == f"{topic}/2"
    new = src.open(names[-1], None)  # a new partition: from its start, whatever start says
    assert new.position == 0
    assert offsets(read_all(new, 3)) == [0, 1, 2]
    new.close()
    for f in admin.delete_topics([topic]).values():
        f.result(30)
    deadline = time.monotonic() + 30
    with pytest.raises(SourceError, match=f"topic '{topic}' disappeared"):  # noqa: PT012
        while time.monotonic() < deadline:
            src.discover()
            time.sleep(0.1)
    src.close()


def _delete_records(bootstrap: str, topic: str, partition: int, before: int) -> None:
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})
    futs = admin.delete_records([TopicPartition(topic, partition, before)])
    for f in futs.values():
        f.result(30)


def test_expired_before_the_run(source: tuple[Any, str]) -> None:
    kafka, topic = source
    produce(kafka.bootstrap, topic, [_event(i) for i in range(10)])
    _delete_records(kafka.bootstrap, topic, 0, 6)
    src = _open(kafka.bootstrap, topic)
    src.discover()
    with pytest.raises(SourceExpiredError) as err:
        src.open(f"{topic}/0", 2)
    msg = str(err.value)
    assert f"{topic}/0" in msg and "offset 2" in msg and "earliest retained offset 6" in msg
    assert f"replay --from {topic}/0=6" in msg and "--start-over" in msg
    part = src.open(f"{topic}/0", None)  # earliest: the log start offset
    assert part.position == 6 and part.earliest() == 6
    with pytest.raises(SourceExpiredError):
        part.seek(5)
    part.close()
    src.close()


def test_expired_during_the_run(source: tuple[Any, str]) -> None:
    """Records deleted after the run started but before it fetched them stop it.

    The client fetches ahead of what the runtime polls (records it fetched before
    the deletion are read, rightly); a partition whose client is held back (paused,
    as a busy runtime would leave it) meets the deletion on its next fetch."""
    kafka, topic = source
    produce(kafka.bootstrap, topic, [_event(i) for i in range(10)])
    src = _open(kafka.bootstrap, topic)
    src.discover()
    part = src.open(f"{topic}/0", None)
    assert offsets(read_all(part, 10, max_records=4)) == list(range(10))
    tp = ck.TopicPartition(topic, 0)
    part._consumer.pause([tp])  # the client fetches nothing from here on
    produce(kafka.bootstrap, topic, [_event(i) for i in range(10, 20)])
    _delete_records(kafka.bootstrap, topic, 0, 15)
    part._consumer.resume([tp])
    deadline = time.monotonic() + 60
    seen: list[int] = []
    with pytest.raises(SourceExpiredError) as err:  # noqa: PT012
        while time.monotonic() < deadline:
            c = part.poll(4, 100)
            assert c is not None
            seen += c.events["__off"].to_list()
    assert seen == []  # never a silent jump over 10..14
    msg = str(err.value)
    assert f"{topic}/0: offset 10" in msg and "earliest retained offset 15" in msg
    part.close()
    src.close()


def test_broker_unreachable_at_start_names_the_address() -> None:
    from sealstream.testing.brokers import free_port

    address = f"127.0.0.1:{free_port()}"
    src = _open(address, "events", fail_after_ms=1_500)
    t0 = time.monotonic()
    with pytest.raises(SourceUnavailableError, match=address):
        src.discover()
    assert time.monotonic() - t0 < 60  # bounded (fail_after_ms plus one query)
    src.close()


def _wait_for(cond: Any, what: str, limit_s: float = 60.0) -> None:
    deadline = time.monotonic() + limit_s
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"


def test_broker_stopped_and_restarted_mid_run(own_kafka: Any) -> None:
    topic = own_kafka.new_topic(partitions=1)
    produce(own_kafka.bootstrap, topic, [_event(i) for i in range(5)])
    src = _open(own_kafka.bootstrap, topic, fail_after_ms=120_000)
    src.discover()
    part = src.open(f"{topic}/0", None)
    got = offsets(read_all(part, 5))
    own_kafka.broker.stop()

    def lost() -> bool:
        part.poll(10, 100)
        return not part.connected

    _wait_for(lost, "the partition to notice the broker is gone")
    assert src.connected is False  # what the panel and metrics show
    own_kafka.broker.start()
    produce(own_kafka.bootstrap, topic, [_event(i) for i in range(5, 10)])
    deadline = time.monotonic() + 60
    while part.position < 10:
        assert time.monotonic() < deadline
        c = part.poll(10, 200)
        assert c is not None
        got += c.events["__off"].to_list()
    assert got == list(range(10)) and part.connected
    assert src.connected is True and part.cached_lag() == 0
    part.close()
    src.close()


def test_broker_gone_longer_than_fail_after_ms(own_kafka: Any) -> None:
    topic = own_kafka.new_topic(partitions=1)
    produce(own_kafka.bootstrap, topic, [_event(0)])
    src = _open(own_kafka.bootstrap, topic, fail_after_ms=1_500)
    src.discover()
    part = src.open(f"{topic}/0", None)
    read_all(part, 1)
    own_kafka.broker.stop()
    deadline = time.monotonic() + 90
    with pytest.raises(SourceUnavailableError, match=own_kafka.bootstrap):  # noqa: PT012
        while time.monotonic() < deadline:
            part.poll(10, 100)
    part.close()
    src.close()


def test_group_gets_positions_for_lag_tools(source: tuple[Any, str]) -> None:
    kafka, topic = source
    group = f"g-{topic}"
    src = _open(kafka.bootstrap, topic, group=group)
    names = src.discover()
    src.commit_group({names[0]: 5, names[1]: 1})
    src.commit_group({names[0]: 7, names[1]: 3})  # the newest goes out after the first
    src.close()  # the commits are not waited for, but close lets the last one land
    c = ck.Consumer({"bootstrap.servers": kafka.bootstrap, "group.id": group})
    got = c.committed([ck.TopicPartition(topic, 0), ck.TopicPartition(topic, 1)], timeout=30)
    assert [tp.offset for tp in got] == [7, 3]
    c.close()


def test_the_group_commit_never_waits_for_a_broker_that_is_gone(own_kafka: Any) -> None:
    """The group only serves lag tools: telling it the positions must not hold the
    run while the broker is away (fail_after_ms decides when the run fails)."""
    import threading

    topic = own_kafka.new_topic(partitions=1)
    src = _open(own_kafka.bootstrap, topic, group=f"g-{topic}")
    name = src.discover()[0]
    src.commit_group({name: 0})
    own_kafka.broker.kill()
    done = threading.Event()

    def tell_and_close() -> None:
        src.commit_group({name: 0})
        src.commit_group({name: 0})
        src.close()
        done.set()

    threading.Thread(target=tell_and_close, daemon=True).start()
    # a hang detector, not a speed target: a synchronous commit never returned
    assert done.wait(120), "commit_group or close waited for the broker"


def test_metrics_show_the_broker_link_and_lag() -> None:
    from sealstream.cli._metrics import Snapshot, render

    text = render(Snapshot(pipeline="p", connected=False, lags=(("t/0", 3),)))
    assert 'sealstream_source_connected{pipeline="p"} 0' in text
    assert 'sealstream_source_lag{pipeline="p",partition="t/0"} 3' in text
