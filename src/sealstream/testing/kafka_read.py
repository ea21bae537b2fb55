"""Reading a Kafka topic as a ``read_committed`` consumer sees it, for tests and
benchmarks: every committed message from the beginning to the current end."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

from sealstream.sources._kafka_log import RECEIVE_MAX_BYTES

__all__ = ["Message", "read_committed"]


@dataclass(frozen=True)
class Message:
    partition: int
    offset: int
    key: bytes | None
    value: bytes
    headers: tuple[tuple[str, bytes], ...]


def read_committed(bootstrap: str, topic: str, timeout_s: float = 60.0) -> list[Message]:
    """Every committed message of ``topic`` (all partitions, in partition then offset
    order). Raises TimeoutError when the end is not reached within ``timeout_s``."""
    from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

    c: Any = Consumer({"bootstrap.servers": bootstrap, "group.id": f"t-{uuid.uuid4().hex}",
                  "isolation.level": "read_committed", "enable.auto.commit": False,
                  "enable.partition.eof": True, "auto.offset.reset": "earliest",
                  "receive.message.max.bytes": RECEIVE_MAX_BYTES})
    out: list[Message] = []
    try:
        md = c.list_topics(topic, timeout=timeout_s)
        parts = sorted(md.topics[topic].partitions)
        ends = {}
        assign = []
        for p in parts:
            lo, hi = c.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout_s,
                                             cached=False)
            ends[p] = hi
            if lo < hi:
                assign.append(TopicPartition(topic, p, lo))
        pending = {tp.partition for tp in assign}
        if assign:
            c.assign(assign)
        deadline = time.monotonic() + timeout_s
        while pending:
            if time.monotonic() > deadline:
                raise TimeoutError(f"reading {topic} did not reach its end")
            for m in c.consume(10_000, 0.5):
                err = m.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        pending.discard(m.partition())
                        continue
                    raise KafkaException(err)
                if m.offset() + 1 >= ends[m.partition()]:
                    pending.discard(m.partition())
                out.append(Message(m.partition(), m.offset(), m.key(), m.value(),
                                   tuple(m.headers() or ())))
    finally:
        c.close()
    out.sort(key=lambda m: (m.partition, m.offset))
    return out
