"""KafkaSink specifics on a real broker: messages (key, JSON value, identity and
token headers), broker faults retried for a bounded time, fencing of a second
instance, and the spec settings of a kafka output."""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path
from typing import Any

import pytest

from sealstream.errors import SinkError, SpecError
from sealstream.pipeline import Output
from sealstream.pipeline.spec import pipeline_from_dict
from sealstream.sinks import open_sink
from sealstream.sinks.kafka import KafkaSink, parse_location
from sealstream.testing.kafka_read import read_committed
from sealstream.testing.sink_contract import results_frame, sample_rows


def _sink(bootstrap: str, topic: str, path: Path, run: str = "run1", **kw: Any) -> KafkaSink:
    return KafkaSink(bootstrap, topic, "results", run, path, **kw)


def test_one_message_per_row_with_key_json_value_and_identity(kafka: Any,
                                                               tmp_path: Path) -> None:
    topic = kafka.new_topic(3)
    sink = _sink(kafka.bootstrap, topic, tmp_path / "s")
    sink.recover({})
    rows = sample_rows("results", 1, n=6)
    sink.write(1, results_frame(rows))
    tokens = sink.prepare(1)
    assert read_committed(kafka.bootstrap, topic) == []
    sink.commit(1, tokens)
    msgs = read_committed(kafka.bootstrap, topic)
    assert sorted(json.loads(m.value)["window_start"] for m in msgs) == sorted(
        r["window_start"] for r in rows)
    for m in msgs:
        value = json.loads(m.value)
        assert m.key == str(value["key"]).encode()
        h = dict(m.headers)
        ident = json.loads(h["sealstream-id"])
        assert ident == {"key": str(value["key"]), "__kint": isinstance(value["key"], int),
                         "window_start": value["window_start"],
                         "window_end": value["window_end"]}
        assert h["sealstream-token"] == tokens[0].encode()
    loc = parse_location(sink.location())
    assert loc is not None and loc[0] == topic and sum(loc[1].values()) >= len(rows)
    sink.close()


def test_a_second_instance_fences_the_first(kafka: Any, tmp_path: Path) -> None:
    topic = kafka.new_topic(1)
    first = _sink(kafka.bootstrap, topic, tmp_path / "a", "runA", transactional_id="job-x")
    first.recover({})
    first.write(1, results_frame(sample_rows("results", 1)))
    t1 = first.prepare(1)
    second = _sink(kafka.bootstrap, topic, tmp_path / "b", "runB", transactional_id="job-x")
    second.recover({})  # takes the transactional.id over
    with pytest.raises(SinkError, match="taken over by another instance"):
        first.commit(1, t1)
    assert read_committed(kafka.bootstrap, topic) == []
    first.close()
    second.close()


def test_broker_away_during_commit_is_retried_until_it_is_back(own_kafka: Any,
                                                               tmp_path: Path) -> None:
    topic = own_kafka.new_topic(2)
    sink = _sink(own_kafka.bootstrap, topic, tmp_path / "s", retry_s=120,
                 settings={"transaction.timeout.ms": "5000"})
    sink.recover({})
    rows = sample_rows("results", 1, n=4)
    sink.write(1, results_frame(rows))
    tokens = sink.prepare(1)
    retrying = threading.Event()

    class Seen(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "retrying" in record.getMessage():
                retrying.set()

    handler = Seen()
    log = logging.getLogger("sealstream.kafka")
    log.addHandler(handler)
    own_kafka.broker.stop()
    failure: list[BaseException] = []

    def commit() -> None:
        try:
            sink.commit(1, tokens)
        except BaseException as exc:  # noqa: BLE001 - reported below
            failure.append(exc)

    worker = threading.Thread(target=commit)
    worker.start()
    try:
        assert retrying.wait(120), "the sink did not retry"
        own_kafka.broker.start()
    finally:
        worker.join(180)
        log.removeHandler(handler)
    assert not failure, failure
    assert len(read_committed(own_kafka.bootstrap, topic)) == len(rows)
    sink.close()


def test_broker_gone_for_good_fails_clearly_after_the_retry_time(own_kafka: Any,
                                                                 tmp_path: Path) -> None:
    topic = own_kafka.new_topic(1)
    sink = _sink(own_kafka.bootstrap, topic, tmp_path / "s", retry_s=3,
                 settings={"transaction.timeout.ms": "2000"})
    sink.recover({})
    sink.write(1, results_frame(sample_rows("results", 1)))
    tokens = sink.prepare(1)
    own_kafka.broker.stop()
    with pytest.raises(SinkError) as info:
        sink.commit(1, tokens)
    msg = str(info.value)
    assert topic in msg and "retried for 3 s" in msg and "\n" not in msg
    assert (tmp_path / "s" / f".part-{tokens[0]}.arrow").exists()  # kept for the next run
    sink.close()


def test_a_missing_topic_is_a_clear_error(kafka: Any, tmp_path: Path) -> None:
    sink = _sink(kafka.bootstrap, "no-such-topic-here", tmp_path / "s", retry_s=5)
    with pytest.raises(SinkError, match="no-such-topic-here"):
        sink.recover({})
    sink.close()


BASE: dict[str, Any] = {
    "pipeline": {"name": "p"},
    "source": {"kind": "jsonl", "paths": ["in.jsonl"], "key": "k", "time": "t"},
    "window": {"kind": "tumbling", "size_ms": 1000},
    "aggregates": {"n": "count"},
}


def _spec(**outputs: dict[str, Any]) -> Any:
    return pipeline_from_dict({**BASE, **outputs}, Path("."))


def test_spec_kafka_outputs(tmp_path: Path) -> None:
    p = _spec(sink={"kind": "kafka", "bootstrap": "h:9092", "topic": "res",
                    "settings": {"linger.ms": 5, "enable.idempotence": True}},
              late={"kind": "kafka", "bootstrap": "h:9092", "topic": "late"},
              errors={"kind": "kafka", "bootstrap": "h:9092", "topic": "bad",
                      "path": "stage-errors"})
    assert p.sink.kind == "kafka" and p.sink.topic == "res"
    assert dict(p.sink.settings) == {"linger.ms": "5", "enable.idempotence": "true"}
    assert p.errors is not None and p.errors.path == "stage-errors"


@pytest.mark.parametrize(("sink", "message"), [
    ({"kind": "kafka", "topic": "x"}, "sink.bootstrap"),
    ({"kind": "kafka", "bootstrap": "h:1"}, "sink.topic"),
    ({"kind": "kafka", "bootstrap": "h:1", "topic": "a b"}, "not a valid Kafka topic"),
    ({"kind": "kafka", "bootstrap": "h:1", "topic": "x", "settings": 3}, "sink.settings"),
    ({"kind": "jsonl", "path": "o", "topic": "x"}, 'for kind = "kafka"'),
])
def test_spec_kafka_refusals(sink: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecError, match=message):
        _spec(sink=sink)


def test_spec_refuses_one_topic_for_two_outputs() -> None:
    out = {"kind": "kafka", "bootstrap": "h:1", "topic": "same"}
    with pytest.raises(SpecError, match="also the sink topic"):
        _spec(sink=out, late=dict(out))


def test_open_sink_kafka(tmp_path: Path) -> None:
    sink = open_sink(Output(kind="kafka", bootstrap="h:1", topic="t", base_dir=tmp_path),
                     "records", "r1")
    assert isinstance(sink, KafkaSink) and sink.role == "records"
    assert sink.path == tmp_path / ".sealstream-staging" / "kafka-t"
    sink.set_job("job", "late")
    assert sink.transactional_id == "sealstream-job-late"


def test_the_documented_example_runs(kafka: Any, tmp_path: Path) -> None:
    """examples/kafka/spec.toml (shown in docs/kafka-output.md) as written, on the test
    broker: the topic holds what the same job writes to a jsonl directory."""
    import shutil
    import subprocess
    import sys

    from sealstream.testing.datagen import generate

    root = Path(__file__).resolve().parents[2]
    doc = (root / "docs" / "kafka-output.md").read_text()
    text = (root / "examples" / "kafka" / "spec.toml").read_text()
    assert text in doc
    d = tmp_path / "ex"
    d.mkdir()
    generate(d / "in", events=20_000, keys=50, partitions=2)
    topic = kafka.new_topic(3)
    (d / "spec.toml").write_text(text.replace("127.0.0.1:9092", kafka.bootstrap)
                                 .replace("page-views-per-minute", topic))
    files = text.replace('kind = "kafka"\nbootstrap = "127.0.0.1:9092"\n'
                         'topic = "page-views-per-minute"', 'kind = "jsonl"\npath = "out"')
    (d / "files.toml").write_text(files.replace('path = "ckpt"', 'path = "ckpt2"')
                                  .replace('path = "late"', 'path = "late2"'))
    for spec in ("spec.toml", "files.toml"):
        res = subprocess.run([sys.executable, "-m", "sealstream", "run", str(d / spec),
                              "--quiet"], capture_output=True, text=True, timeout=300)
        assert res.returncode == 0, res.stderr
    # floats within 1e-9 relative (semantics section 6): the two runs pace their steps
    # apart, and a float sum's additions are grouped by step
    from helpers import same_value

    def by_id(rows: list[dict[str, Any]]) -> dict[tuple[Any, ...], dict[str, Any]]:
        return {(r["key"], r["window_start"], r["window_end"]): r for r in rows}

    messages = [json.loads(m.value) for m in read_committed(kafka.bootstrap, topic)]
    got = by_id(messages)
    assert len(got) == len(messages), "a result is in the topic more than once"
    want = by_id([json.loads(line) for f in sorted((d / "out").glob("*.jsonl"))
                  for line in f.read_text().splitlines()])
    assert got and got.keys() == want.keys()
    assert all(same_value(want[k], got[k]) for k in want)
    shutil.rmtree(d)


def test_a_retried_commit_settles_the_transactional_id_before_reading_back(
        own_kafka: Any, tmp_path: Path) -> None:
    """After a failed commit attempt (here: the broker away), the next attempt first
    makes its new producer (``init_transactions`` completes a commit the broker was
    finishing, or aborts the open transaction), and only then reads the topic back
    to see whether the epoch made it. Read back first, a commit completed after the
    read-back would be produced a second time. Calls are recorded on the real sink
    against a real broker; the rows are committed once."""
    topic = own_kafka.new_topic(2)
    sink = _sink(own_kafka.bootstrap, topic, tmp_path / "s", retry_s=120,
                 settings={"transaction.timeout.ms": "5000"})
    sink.recover({})
    rows = sample_rows("results", 1, n=4)
    sink.write(1, results_frame(rows))
    tokens = sink.prepare(1)
    calls: list[str] = []
    new_producer, read_back_once = sink._new_producer, sink._read_back_once

    def recorded_producer() -> Any:
        p = new_producer()
        calls.append("producer")
        return p

    def recorded_read_back(start: Any) -> Any:
        out = read_back_once(start)
        calls.append("read-back")
        return out

    sink._new_producer = recorded_producer  # type: ignore[method-assign]
    sink._read_back_once = recorded_read_back  # type: ignore[method-assign]
    retrying = threading.Event()

    class Seen(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "retrying" in record.getMessage():
                retrying.set()

    handler = Seen()
    log = logging.getLogger("sealstream.kafka")
    log.addHandler(handler)
    own_kafka.broker.stop()
    failure: list[BaseException] = []

    def commit() -> None:
        try:
            sink.commit(1, tokens)
        except BaseException as exc:  # noqa: BLE001 - reported below
            failure.append(exc)

    worker = threading.Thread(target=commit)
    worker.start()
    try:
        assert retrying.wait(120), "the sink did not retry"
        own_kafka.broker.start()
    finally:
        worker.join(180)
        log.removeHandler(handler)
    assert not failure, failure
    # (a first read-back, before the new producer, only looks for another instance)
    assert calls[-2:] == ["producer", "read-back"], \
        f"read back before init_transactions settled it: {calls}"
    assert len(read_committed(own_kafka.bootstrap, topic)) == len(rows)
    sink.close()


def test_commits_after_an_aborted_transaction_are_found_from_the_recorded_offsets(
        kafka: Any, tmp_path: Path) -> None:
    """A run was killed inside a transaction with its rows at the broker; the next
    instance's init_transactions aborts it, commits epoch 1, a checkpoint records the
    end offsets (after the aborted transaction), and epoch 2 is committed. Recovery
    from that checkpoint must find epoch 2 committed after the recorded offsets (its
    staged file is gone), even on a broker that lists the aborted transaction in
    fetches starting after it (the test broker does; the read_committed client then
    hides the producer's later messages)."""
    from confluent_kafka import Producer

    topic = kafka.new_topic(1)
    dead = Producer({"bootstrap.servers": kafka.bootstrap, "transactional.id": "job-y"})
    dead.init_transactions(30)
    dead.begin_transaction()
    for i in range(4):
        dead.produce(topic, b"{}", f"u{i}".encode(),
                     headers=[("sealstream-id", b"{}"),
                              ("sealstream-token", b"000000000001-runA")])
    assert dead.flush(30) == 0  # at the broker, never committed
    live = _sink(kafka.bootstrap, topic, tmp_path / "s", "runB", transactional_id="job-y")
    live.recover({})  # aborts the dead run's transaction
    rows1, rows2 = sample_rows("results", 1, n=5), sample_rows("results", 2, n=7)
    live.write(1, results_frame(rows1))
    live.commit(1, live.prepare(1))
    live.write(2, results_frame(rows2))
    tokens2 = live.prepare(2)
    floor = live.location()  # what checkpoint 2 records: the end after epoch 1
    live.commit(2, tokens2)
    live.close()
    assert len(read_committed(kafka.bootstrap, topic)) == len(rows1) + len(rows2)
    again = _sink(kafka.bootstrap, topic, tmp_path / "s", "runC", transactional_id="job-y")
    again.recover_at(floor, {2: tokens2})  # epoch 2 is in Kafka: nothing to produce
    assert [f.token for f in again.committed()] == tokens2
    assert len(read_committed(kafka.bootstrap, topic)) == len(rows1) + len(rows2)
    again.close()


def test_a_fenced_instance_retrying_after_a_broker_fault_does_not_produce_again(
        own_kafka: Any, tmp_path: Path) -> None:
    """Instance A prepared epoch 1; instance B of the same job takes the
    transactional.id over and commits the same rows. A's commit then meets the broker
    away (a retriable error, so A does not learn it was fenced) and retries once the
    broker is back: its new producer would take the transactional.id back. A must see
    that another instance of the job committed after its last end and stop as fenced,
    not produce the rows a second time."""
    topic = own_kafka.new_topic(1)
    rows = sample_rows("results", 1, n=5)
    first = _sink(own_kafka.bootstrap, topic, tmp_path / "a", "runA",
                  transactional_id="job-z", retry_s=120,
                  settings={"transaction.timeout.ms": "3000"})
    first.recover({})
    first.write(1, results_frame(rows))
    t1 = first.prepare(1)
    second = _sink(own_kafka.bootstrap, topic, tmp_path / "b", "runB",
                   transactional_id="job-z")
    second.recover({})  # fences A
    second.write(1, results_frame(rows))
    second.commit(1, second.prepare(1))
    second.close()
    assert len(read_committed(own_kafka.bootstrap, topic)) == len(rows)
    retrying = threading.Event()

    class Seen(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "retrying" in record.getMessage():
                retrying.set()

    handler = Seen()
    log = logging.getLogger("sealstream.kafka")
    log.addHandler(handler)
    own_kafka.broker.stop()
    failure: list[BaseException] = []

    def commit() -> None:
        try:
            first.commit(1, t1)
        except BaseException as exc:  # noqa: BLE001 - checked below
            failure.append(exc)

    worker = threading.Thread(target=commit)
    worker.start()
    try:
        assert retrying.wait(120), "the sink did not retry"
        own_kafka.broker.start()
    finally:
        worker.join(180)
        log.removeHandler(handler)
    assert not worker.is_alive()
    assert len(read_committed(own_kafka.bootstrap, topic)) == len(rows), "produced twice"
    assert failure and isinstance(failure[0], SinkError), failure
    assert "taken over by another instance" in str(failure[0]), failure[0]
    first.close()
