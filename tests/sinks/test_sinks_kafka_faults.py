"""KafkaSink under faults on a real broker: a fence that surfaces from inside a client
call as a SystemError is the one-line fenced error."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sealstream.errors import SinkError
from sealstream.sinks.kafka import KafkaSink

ck = pytest.importorskip("confluent_kafka")


def _fenced_error(bootstrap: str, topic: str, tid: str) -> Exception:
    """The real KafkaException of a producer fenced by a second one (same id)."""
    a = ck.Producer({"bootstrap.servers": bootstrap, "transactional.id": tid})
    a.init_transactions(30)
    a.begin_transaction()
    a.produce(topic, b"x")
    a.flush(30)
    ck.Producer({"bootstrap.servers": bootstrap, "transactional.id": tid}).init_transactions(30)
    try:
        a.commit_transaction(30)
    except ck.KafkaException as e:
        return e
    raise AssertionError("the first producer was not fenced")


def test_a_fence_surfacing_as_a_system_error_is_the_fenced_line(
        kafka: Any, tmp_path: Path) -> None:
    """confluent-kafka reports an exception raised while a C call (flush() serving
    its callbacks) ran as "SystemError: <built-in function isinstance> returned a
    result with an exception set", caused by the KafkaException. The sink's retry
    loop caught KafkaException only, so the fence escaped as that SystemError (1 of 4
    concurrent starts); it is the one-line fenced error, not retried."""
    topic = kafka.new_topic(1)
    fenced = _fenced_error(kafka.bootstrap, topic, f"fence-{topic}")
    sink = KafkaSink(kafka.bootstrap, topic, "results", "run1", tmp_path / "s",
                     transactional_id=f"fence-{topic}")
    calls = 0

    def flush_meeting_the_fence() -> None:
        nonlocal calls
        calls += 1
        try:
            raise fenced
        except ck.KafkaException as e:
            raise SystemError("<built-in function isinstance> returned a result with an "
                              "exception set") from e

    with pytest.raises(SinkError) as e:
        sink._retrying("commit a transaction to", flush_meeting_the_fence)
    msg = str(e.value)
    assert calls == 1 and "\n" not in msg
    assert f"Kafka topic {topic!r}" in msg and "taken over by another instance" in msg
    sink.close()


def test_other_system_errors_are_not_swallowed(kafka: Any, tmp_path: Path) -> None:
    sink = KafkaSink(kafka.bootstrap, kafka.new_topic(1), "results", "run1", tmp_path / "s")

    def broken() -> None:
        raise SystemError("something else")

    with pytest.raises(SystemError, match="something else"):
        sink._retrying("commit a transaction to", broken)
    sink.close()
