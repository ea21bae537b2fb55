"""A backlog whose fetch answer is larger than librdkafka's 100 MB default.

noida-db answers a fetch with everything it has, whatever ``fetch.max.bytes`` asks
(Kafka bounds the answer). With librdkafka's default ``receive.message.max.bytes``
(100 MB) such an answer is refused on every try: a source on a 2,000,000-event topic
never read a record and failed with "FindCoordinator response error: Local: Bad
message format" (measured on this broker). The consumers that read records now ask
for librdkafka's largest ``receive.message.max.bytes``; a spec's ``client`` table can
still set it. Here a backlog of ~110 MB in 3 partitions (messages of ~850 KB) is read
to its end by the source, and by the reader that reads a topic back
(``testing.kafka_read``). With the 100 MB default the reader fails (its one fetch
answer of 112 MB refused, again and again); the source, whose fetches of this shape
stay smaller, reads it either way, so for the source this test checks the setting and
that a spec can override it (the 2,000,000-event case takes too long to produce here).
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from sealstream.sources import FieldPlan
from sealstream.sources._kafka_log import RECEIVE_MAX_BYTES
from sealstream.sources.kafka import KafkaSettings, KafkaSource
from sealstream.testing.kafka_read import read_committed

ck = pytest.importorskip("confluent_kafka")

PER_PARTITION = 44
PAD = "x" * 850_000


def _value(p: int, i: int) -> bytes:
    return json.dumps({"user": f"u{p}", "ts": 1_000 * i, "amount": i, "pad": PAD}).encode()


def test_a_backlog_larger_than_100_mb_is_read_to_its_end(kafka: Any) -> None:
    topic = kafka.new_topic(partitions=3)
    prod = ck.Producer({"bootstrap.servers": kafka.bootstrap, "linger.ms": 5,
                        "message.max.bytes": 1_000_000})
    for p in range(3):
        for i in range(PER_PARTITION):
            prod.produce(topic, _value(p, i), partition=p)
    assert prod.flush(60) == 0
    assert 3 * PER_PARTITION * len(_value(0, 0)) > 100_000_000

    settings = KafkaSettings(kafka.bootstrap, topic, stop="end")
    assert settings.consumer_config()["receive.message.max.bytes"] == RECEIVE_MAX_BYTES
    # a spec's client table still decides
    assert KafkaSettings(kafka.bootstrap, topic, client={
        "receive.message.max.bytes": "200000000"}).consumer_config()[
        "receive.message.max.bytes"] == "200000000"
    src = KafkaSource(settings, FieldPlan(key="user", time="ts", fields={"amount": "numeric"}))
    try:
        parts = [src.open(name, None) for name in src.discover()]
        got: dict[int, int] = {}
        deadline = time.monotonic() + 120
        for n, part in enumerate(parts):
            while part.position < PER_PARTITION:
                assert time.monotonic() < deadline, f"partition {n} stuck at {part.position}"
                chunk = part.poll(1000, 200)
                assert chunk is not None
                got[n] = got.get(n, 0) + chunk.events.height
                assert chunk.bad.height == 0
        assert got == dict.fromkeys(range(3), PER_PARTITION)
    finally:
        src.close()
    assert len(read_committed(kafka.bootstrap, topic, timeout_s=120)) == 3 * PER_PARTITION
