"""One consumer for all of a Kafka source's partitions (``sources/_kafka_shared.py``),
against a real Kafka-protocol broker: the partitions' records come from one fetch
interleaved and are parsed in one call, yet each partition hands out exactly its own
records, bad ones named by its own offsets, from its own position; a seek of one
leaves the others alone; a partition left unpolled is paused, not buffered without
bound."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from sealstream.sources import FieldPlan, _kafka_shared
from sealstream.sources._base import Chunk
from sealstream.sources.kafka import KafkaPartition, KafkaSettings, KafkaSource

ck = pytest.importorskip("confluent_kafka")
PLAN = FieldPlan(key="user", time="ts", fields={"amount": "numeric"})
N = 120


def _value(p: int, i: int) -> bytes:
    if p == 1 and i % 17 == 5:
        return b"not json"
    return json.dumps({"user": f"u{i % 4}", "ts": 1_000 * i, "amount": 1000 * p + i}).encode()


def _produce(bootstrap: str, topic: str, parts: int, n: int) -> None:
    prod = ck.Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for i in range(n):  # interleaved, so that fetches bring the partitions together
        for p in range(parts):
            prod.produce(topic, _value(p, i), partition=p)
    assert prod.flush(30) == 0


def _read(part: KafkaPartition, until: int, out: list[Chunk], max_records: int) -> bool:
    """One poll unless at ``until``; True when it is there."""
    if part.position >= until:
        return True
    c = part.poll(max_records, 100)
    assert c is not None
    out.append(c)
    return part.position >= until


def _read_all(parts: list[KafkaPartition], until: int, max_records: int
              ) -> list[list[Chunk]]:
    got: list[list[Chunk]] = [[] for _ in parts]
    deadline = time.monotonic() + 120  # only guards a hang
    while not all([_read(p, until, got[q], max_records) for q, p in enumerate(parts)]):
        assert time.monotonic() < deadline, [p.position for p in parts]
    return got


def _good(chunks: list[Chunk]) -> list[int]:
    return [o for c in chunks for o in c.events["__off"].to_list()]


def _bad(chunks: list[Chunk]) -> list[int]:
    return [o for c in chunks for o in c.bad["_offset"].to_list()]


def _amounts(chunks: list[Chunk]) -> list[int]:
    return [a for c in chunks for a in c.events["__i:amount"].to_list()]


def test_partitions_share_one_consumer_and_keep_their_own_records(kafka: Any) -> None:
    topic = kafka.new_topic(partitions=3)
    _produce(kafka.bootstrap, topic, 3, N)
    src = KafkaSource(KafkaSettings(kafka.bootstrap, topic), PLAN)
    parts = [src.open(n, None) for n in src.discover()]
    # one fetching client for the three (the old path: a consumer each)
    assert len({id(p._consumer) for p in parts}) == 1
    got = _read_all(parts, N, max_records=7)
    bad1 = [i for i in range(N) if i % 17 == 5]
    for p, chunks in enumerate(got):
        bad = bad1 if p == 1 else []
        assert _good(chunks) == [i for i in range(N) if i not in bad]
        assert _bad(chunks) == bad
        assert _amounts(chunks) == [1000 * p + i for i in range(N) if i not in bad]
        assert all(c.events.height + c.bad.height <= 7 for c in chunks)
        # the raw text of an event is looked up by its own partition's offset
        c = next(c for c in chunks if c.raw is not None and c.events.height)
        assert c.raw is not None
        off = c.events["__off"].to_numpy()[-1:]
        assert json.loads(c.raw.texts(off)[0])["amount"] == 1000 * p + int(off[0])
    assert {r for c in got[1] for r in c.bad["_reason"].to_list()}
    assert [p.position for p in parts] == [N, N, N]
    # a seek of one partition: it reads again from there, the others are untouched
    parts[0].seek(50)
    again = _read_all(parts, N, max_records=1000)
    assert _good(again[0]) == list(range(50, N))
    assert _good(again[1]) == [] and _good(again[2]) == []
    for p in parts:
        p.close()
    src.close()


def test_a_partition_left_unpolled_is_paused_then_read_exactly(
        kafka: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_kafka_shared, "PAUSE_AT", 10)
    topic = kafka.new_topic(partitions=2)
    _produce(kafka.bootstrap, topic, 2, N)
    src = KafkaSource(KafkaSettings(kafka.bootstrap, topic), PLAN)
    p0, p1 = (src.open(n, None) for n in src.discover())
    assert isinstance(p0, _kafka_shared.SharedPartition)
    assert isinstance(p1, _kafka_shared.SharedPartition)
    first: list[Chunk] = []
    deadline = time.monotonic() + 120
    while not _read(p0, N, first, 5):
        assert time.monotonic() < deadline, p0.position
    assert _good(first) == list(range(N))
    # what came for partition 1 meanwhile stays queued, bounded: it is paused once
    # PAUSE_AT records wait (at most one fetch, 2 x 5 records, more than that)
    assert p1._num in p1._reader.paused and p1._queued < 10 + 2 * 5
    assert p1.position == 0
    rest = _read_all([p1], N, max_records=1000)[0]
    assert sorted(_good(rest) + _bad(rest)) == list(range(N))
    assert p1._num not in p1._reader.paused
    p0.close()
    p1.close()
    src.close()


def test_per_partition_consumers_stay_available(
        kafka: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(_kafka_shared.ENV, "per-partition")
    topic = kafka.new_topic(partitions=2)
    _produce(kafka.bootstrap, topic, 2, 10)
    src = KafkaSource(KafkaSettings(kafka.bootstrap, topic), PLAN)
    parts = [src.open(n, None) for n in src.discover()]
    assert not any(isinstance(p, _kafka_shared.SharedPartition) for p in parts)
    got = _read_all(parts, 10, max_records=1000)
    assert [sorted(_good(c) + _bad(c)) for c in got] == [list(range(10)), list(range(10))]
    for p in parts:
        p.close()
    src.close()
