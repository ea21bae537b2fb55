"""The test broker's known defect: noida-db 0.2.3 forgets an open transaction when it
restarts, yet acknowledges ``commit_transaction()``; the rows never become visible to
``read_committed`` readers (real Kafka keeps an open transaction across a restart).

Measured here with a bare producer, and the sink's guard against it: after a commit
that followed a broker reconnect, the sink reads the epoch's token back before it
deletes the staged copy, and produces the epoch again when it is missing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from _kafka_story import assert_topics_match, kafka_spec
from _story import make_input, run, uninterrupted, write_spec

from sealstream.testing.kafka_read import read_committed

ck = pytest.importorskip("confluent_kafka")

expected = uninterrupted(errors=True, bad_every=97)


def test_the_test_broker_forgets_an_open_transaction_on_restart(own_kafka: Any) -> None:
    """Measured: N rows produced and flushed inside a transaction, the broker restarted
    (a graceful stop: nothing of what it acknowledged is lost otherwise), then
    ``commit_transaction()`` is acknowledged and 0 of the N rows are visible. If this
    test fails, the broker was fixed: update docs/kafka-output.md (broker limits)."""
    topic = own_kafka.new_topic(1)
    n = 100
    p = ck.Producer({"bootstrap.servers": own_kafka.bootstrap,
                     "transactional.id": f"defect-{uuid.uuid4().hex[:8]}"})
    p.init_transactions(30)
    p.begin_transaction()
    for i in range(n):
        p.produce(topic, f"row {i}".encode())
    assert p.flush(30) == 0
    own_kafka.broker.stop()
    own_kafka.broker.start()
    p.commit_transaction(60)  # acknowledged: no exception
    visible = len(read_committed(own_kafka.bootstrap, topic))
    assert visible == 0, f"{visible} of {n} rows visible: the broker kept the transaction"


def _wait_stopped(pid: int, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        if state == "T":
            return
        time.sleep(0.02)
    raise AssertionError(f"process {pid} did not stop at its pause point")


def test_an_epoch_the_broker_forgot_across_a_restart_is_produced_again(
        tmp_path: Path, expected: Path, own_kafka: Any) -> None:
    """The run stops inside an epoch's transaction (rows produced and flushed, not
    committed); the broker restarts; the run goes on and its commit is acknowledged,
    though the broker forgot the transaction. The sink reads the token back (the
    commit followed a reconnect), misses it and produces the epoch again: the topics
    hold every row exactly once, and the run exits 0."""
    names = make_input(tmp_path, bad_every=97)
    spec = write_spec(tmp_path, names, errors=True)
    topics = kafka_spec(spec, own_kafka.bootstrap)
    env = dict(os.environ)
    env.pop("SEALSTREAM_CRASH_AT", None)
    env["SEALSTREAM_PAUSE_AT"] = "kafka_in_transaction:2"
    a = subprocess.Popen([sys.executable, "-m", "sealstream", "run", str(spec), "--quiet"],
                         env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        _wait_stopped(a.pid)
        own_kafka.broker.stop()
        own_kafka.broker.start()
    finally:
        os.kill(a.pid, signal.SIGCONT)
        _, err = a.communicate(timeout=300)
    assert a.returncode == 0, err
    assert_topics_match(own_kafka.bootstrap, topics, expected)
    if a.returncode == 0:  # a finished rerun finds everything and produces nothing
        again = run(spec)
        assert again.returncode == 0, again.stderr
        assert_topics_match(own_kafka.bootstrap, topics, expected)
