"""Partitions of one shared Kafka consumer polled from several threads at once, as a
scale-out worker's read-ahead does (``distributed/_live_read.py`` polls each of its
partitions on a thread pool): every partition must still hand out exactly its own
records, in offset order, none twice and none lost. Against a real broker."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from test_kafka_shared import PLAN, _bad, _good, _produce  # (this directory's helpers)

from sealstream.sources._base import Chunk
from sealstream.sources.kafka import KafkaPartition, KafkaSettings, KafkaSource

pytest.importorskip("confluent_kafka")
N = 3000


def _drain(part: KafkaPartition, out: list[Chunk], errors: list[BaseException]) -> None:
    deadline = time.monotonic() + 300  # only guards a hang
    try:
        while part.position < N:
            assert time.monotonic() < deadline, part.position
            c = part.poll(37, 50)
            assert c is not None
            out.append(c)
    except BaseException as exc:  # noqa: BLE001 - reported by the test's thread
        errors.append(exc)


def test_partitions_polled_from_threads_at_once_keep_their_order(kafka: Any) -> None:
    topic = kafka.new_topic(partitions=3)
    _produce(kafka.bootstrap, topic, 3, N)
    src = KafkaSource(KafkaSettings(kafka.bootstrap, topic), PLAN)
    parts = [src.open(n, None) for n in src.discover()]
    assert len({id(p._consumer) for p in parts}) == 1  # the shared consumer
    got: list[list[Chunk]] = [[] for _ in parts]
    errors: list[BaseException] = []
    threads = [threading.Thread(target=_drain, args=(p, got[q], errors))
               for q, p in enumerate(parts)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    bad1 = [i for i in range(N) if i % 17 == 5]
    for p, chunks in enumerate(got):
        bad = bad1 if p == 1 else []
        assert _good(chunks) == [i for i in range(N) if i not in set(bad)], p
        assert _bad(chunks) == bad, p
        # each chunk's position is where its partition's next record is
        for c in chunks:
            if c.last_offset is not None:
                assert c.position.offset == c.last_offset + 1
    for part in parts:
        part.close()
