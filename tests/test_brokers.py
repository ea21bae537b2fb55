"""The test brokers themselves: real servers on loopback, stopped by their PID."""

from __future__ import annotations

import json
import os

import pytest

from sealstream.testing.brokers import BrokerError, KafkaBroker, NatsServer


def _roundtrip(bootstrap: str, topic: str, n: int, expect: int | None = None) -> list[int]:
    from confluent_kafka import Consumer, Producer, TopicPartition

    prod = Producer({"bootstrap.servers": bootstrap})
    for i in range(n):
        prod.produce(topic, value=json.dumps({"i": i}).encode(), partition=0)
    assert prod.flush(30) == 0
    cons = Consumer({"bootstrap.servers": bootstrap, "group.id": "g",
                     "enable.auto.commit": False})
    cons.assign([TopicPartition(topic, 0, 0)])
    got: list[int] = []
    for _ in range(200):
        for m in cons.consume(100, 0.2):
            assert m.error() is None
            got.append(json.loads(m.value())["i"])
        if len(got) >= (expect or n):
            break
    cons.close()
    return got


def test_kafka_broker_keeps_its_data_across_a_restart(own_kafka) -> None:  # type: ignore[no-untyped-def]
    topic = own_kafka.new_topic(1)
    assert _roundtrip(own_kafka.bootstrap, topic, 5) == [0, 1, 2, 3, 4]
    broker = own_kafka.broker
    pid = broker.pid
    broker.stop()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    broker.start()  # same port, same data
    assert _roundtrip(own_kafka.bootstrap, topic, 5, expect=10) == [0, 1, 2, 3, 4] * 2


def test_a_killed_kafka_broker_is_gone_and_comes_back(own_kafka) -> None:  # type: ignore[no-untyped-def]
    broker = own_kafka.broker
    pid = broker.pid
    broker.kill()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    broker.start()
    topic = own_kafka.new_topic(1)
    assert _roundtrip(own_kafka.bootstrap, topic, 3) == [0, 1, 2]


def test_a_broker_that_cannot_start_says_why(tmp_path) -> None:  # type: ignore[no-untyped-def]
    blocker = KafkaBroker(data_dir=tmp_path / "a")
    blocker.start()
    try:
        clash = KafkaBroker(port=blocker.port, data_dir=tmp_path / "b")
        with pytest.raises(BrokerError, match="kafka"):
            clash.start()
    finally:
        blocker.close()


def test_nats_server_answers_and_stops_by_pid(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with NatsServer(data_dir=tmp_path / "n") as server:
        pid = server.pid
        assert pid is not None
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
