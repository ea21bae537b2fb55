"""KafkaSink under faults on a real broker: a fence that surfaces from inside a client
call as a SystemError is the one-line fenced error; an unreachable broker and a
missing topic, as a user of ``sealstream run`` sees them on stderr."""

from __future__ import annotations

import os
import subprocess
import sys
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


# ------------------------------------------------------------------ stderr of a run
SPEC = """
[pipeline]
name = "noise"
[source]
kind = "jsonl"
paths = ["in.jsonl"]
key = "user"
time = "ts"
[window]
kind = "tumbling"
size_ms = 1000
[aggregates]
n = "count"
[sink]
kind = "kafka"
bootstrap = "{bootstrap}"
topic = "{topic}"
"""


def _run_to_kafka(d: Path, bootstrap: str, topic: str,
                  env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    d.mkdir(parents=True, exist_ok=True)
    (d / "in.jsonl").write_text('{"user": "a", "ts": 1}\n')
    spec = d / "spec.toml"
    spec.write_text(SPEC.format(bootstrap=bootstrap, topic=topic))
    return subprocess.run([sys.executable, "-m", "sealstream", "run", str(spec), "--quiet"],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, **(env or {})})


def test_an_unreachable_broker_gives_a_few_lines_in_our_words(tmp_path: Path) -> None:
    """No %3|...|FAIL| flood from librdkafka while the sink retries (60 s by default;
    SEALSTREAM_KAFKA_RETRY_S sets it, 8 s here): at most one warning line per kind of
    broker error, then the error line saying the broker at that address did not
    answer for that long."""
    from sealstream.testing.brokers import free_port

    address = f"127.0.0.1:{free_port()}"
    r = _run_to_kafka(tmp_path, address, "outx", env={"SEALSTREAM_KAFKA_RETRY_S": "8"})
    assert r.returncode == 1
    lines = r.stderr.strip().splitlines()
    assert not [ln for ln in lines if ln.startswith("%")], lines[:3]
    warnings = [ln for ln in lines if ln.startswith("sealstream: warning:")]
    assert len(warnings) == len(set(warnings)) and len(warnings) <= 3, warnings
    assert all(address in w and w.endswith("retrying") for w in warnings), warnings
    assert len(lines) == len(warnings) + 1, lines
    assert lines[-1].startswith("sealstream: error: cannot start a transactional producer")
    assert f"the broker at {address} did not answer for 8 s" in lines[-1], lines[-1]


def test_a_missing_output_topic_is_named_as_missing(kafka: Any, tmp_path: Path) -> None:
    r = _run_to_kafka(tmp_path, kafka.bootstrap, "no-such-output-topic")
    assert r.returncode == 1
    lines = r.stderr.strip().splitlines()
    assert lines == [f"sealstream: error: topic 'no-such-output-topic' does not exist at "
                     f"{kafka.bootstrap}: create it first (sealstream does not create "
                     "output topics)"], lines
