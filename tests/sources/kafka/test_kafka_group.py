"""The consumer group a Kafka job tells its positions to (for the broker's lag tools):
by default the pipeline's name; ``group = ""`` turns it off; a replay into an isolated
destination never tells the job's group anything."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sealstream._runtime.engine import Job
from sealstream.cli import main
from sealstream.pipeline import load_spec

ck = pytest.importorskip("confluent_kafka")


def write_spec(d: Path, bootstrap: str, topic: str, group: str = "") -> Path:
    d.mkdir(parents=True, exist_ok=True)
    (d / "spec.toml").write_text(f"""
[pipeline]
name = "lagged-{topic}"

[source]
kind = "kafka"
bootstrap = "{bootstrap}"
topic = "{topic}"
stop = "end"
key = "user"
time = "ts"
{group}

[window]
kind = "tumbling"
size_ms = 10000

[aggregates]
n = "count"

[sink]
kind = "jsonl"
path = "{d / 'out'}"

[checkpoint]
path = "{d / 'ckpt'}"
every_ms = 100
""", encoding="utf-8")
    return d / "spec.toml"


def produce(bootstrap: str, topic: str, n: int) -> None:
    p = ck.Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for i in range(n):
        p.produce(topic, json.dumps({"user": "a", "ts": 1000 * i}).encode(), partition=0)
    assert p.flush(30) == 0


def committed(bootstrap: str, group: str, topic: str) -> int:
    c = ck.Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        return int(c.committed([ck.TopicPartition(topic, 0)], timeout=30)[0].offset)
    finally:
        c.close()


def test_the_group_is_the_pipeline_name_and_a_replay_leaves_it_alone(
        kafka: Any, tmp_path: Path) -> None:
    topic = kafka.new_topic(partitions=1)
    produce(kafka.bootstrap, topic, 5)
    spec = write_spec(tmp_path / "job", kafka.bootstrap, topic)
    assert Job(load_spec(spec)).run().counters.events == 5
    assert committed(kafka.bootstrap, f"lagged-{topic}", topic) == 5
    produce(kafka.bootstrap, topic, 3)
    assert main(["replay", str(spec), "--from", f"{topic}/0=0",
                 "--to", str(tmp_path / "dest"), "--quiet"]) == 0
    assert committed(kafka.bootstrap, f"lagged-{topic}", topic) == 5  # isolated


def test_an_empty_group_tells_no_group(kafka: Any, tmp_path: Path) -> None:
    topic = kafka.new_topic(partitions=1)
    produce(kafka.bootstrap, topic, 4)
    spec = write_spec(tmp_path / "job", kafka.bootstrap, topic, group='group = ""')
    assert Job(load_spec(spec)).run().counters.events == 4
    assert committed(kafka.bootstrap, f"lagged-{topic}", topic) < 0  # nothing committed
