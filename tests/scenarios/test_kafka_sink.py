"""Stories with Kafka outputs (results, late events, bad records): run, SIGKILL at a
named step of the commit protocol (or at random instants, or with the newest
checkpoints corrupted), restart, and each topic read ``read_committed`` holds each
row exactly once, equal to an uninterrupted run. A zombie is fenced."""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from _kafka_story import assert_topics_match, kafka_spec
from _story import make_input, reference_run, run, run_killed_randomly, uninterrupted, write_spec

from sealstream._runtime.crash import POINTS
from sealstream.testing.kafka_read import read_committed

pytestmark = pytest.mark.usefixtures("kafka")

expected = uninterrupted(errors=True, bad_every=97)


def _story(d: Path, bootstrap: str, **kw: Any) -> tuple[Path, dict[str, str]]:
    names = make_input(d, bad_every=97)
    spec = write_spec(d, names, errors=True, **kw)
    return spec, kafka_spec(spec, bootstrap)


def test_killed_at_every_protocol_step_in_turn(tmp_path: Path, expected: Path,
                                              kafka: Any) -> None:
    """One job killed at each named step in turn (the second time it gets there in
    each run), then run to its end: exactly the uninterrupted output."""
    spec, topics = _story(tmp_path, kafka.bootstrap)
    for point in [p for p in POINTS if p != "after_write_suppress"] + ["kafka_in_transaction"]:
        crashed = run(spec, crash_at=f"{point}:2")
        if crashed.returncode == 0:  # the job finished before getting there twice
            break
        assert crashed.returncode == -9, f"{point}: {crashed.stderr}"
    else:
        final = run(spec)
        assert final.returncode == 0, final.stderr
    assert_topics_match(kafka.bootstrap, topics, expected)


def test_two_crashes_then_a_finished_rerun_produces_nothing(tmp_path: Path, expected: Path,
                                                            kafka: Any) -> None:
    spec, topics = _story(tmp_path, kafka.bootstrap)
    assert run(spec, crash_at="kafka_in_transaction:3").returncode == -9
    assert run(spec, crash_at="after_commit_results:2").returncode == -9
    assert run(spec).returncode == 0
    assert_topics_match(kafka.bootstrap, topics, expected)
    again = run(spec)
    assert again.returncode == 0, again.stderr
    assert_topics_match(kafka.bootstrap, topics, expected)
    assert not [p for p in tmp_path.glob("staging-*/*")], "staged epochs left behind"


def test_corrupted_newest_checkpoints_fall_back_without_duplicates(
        tmp_path: Path, expected: Path, kafka: Any) -> None:
    """Epochs committed to Kafka after the checkpoint recovery falls back to are
    read back from the topic and not produced again. Before the damage, ``checkpoints
    inspect`` shows each checkpoint's committed offsets, growing epoch by epoch."""
    spec, topics = _story(tmp_path, kafka.bootstrap, keep=20)
    assert run(spec, crash_at="after_retention:5").returncode == -9
    cps = sorted((tmp_path / "ckpt").glob("cp-*"))
    assert len(cps) >= 3
    _check_inspect(tmp_path, topics, [int(cps[0].name[3:]), int(cps[-1].name[3:])])
    for cp in cps[-2:]:  # the two newest: the fallback passes two committed epochs
        m = cp / "MANIFEST.json"
        data = bytearray(m.read_bytes())
        data[len(data) // 2] ^= 0x01
        m.write_bytes(bytes(data))
    resumed = run(spec)
    assert resumed.returncode == 0, resumed.stderr
    assert_topics_match(kafka.bootstrap, topics, expected)


def _check_inspect(d: Path, topics: dict[str, str], ids: list[int]) -> None:
    import json

    seen = []
    for cid in ids:
        res = subprocess.run([sys.executable, "-m", "sealstream", "checkpoints", "inspect",
                              str(d / "ckpt"), str(cid), "--json"],
                             capture_output=True, text=True, timeout=60)
        assert res.returncode == 0, res.stderr
        outs = {o["output"]: o for o in json.loads(res.stdout)["outputs"]}
        assert set(outs) == {"results", "late", "errors"}
        k = outs["results"]["kafka"]
        assert k["topic"] == topics["sink"]
        seen.append((outs["results"]["epoch"], sum(k["committed_offsets"].values())))
    assert seen[0][0] < seen[-1][0] and seen[0][1] < seen[-1][1], seen
    res = subprocess.run([sys.executable, "-m", "sealstream", "checkpoints", "inspect",
                          str(d / "ckpt"), str(ids[-1])], capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 0 and "Kafka outputs" in res.stdout, res.stdout


def test_random_sigkills(tmp_path: Path, kafka: Any) -> None:
    """SIGKILL at random instants (a few seeds; SEALSTREAM_CHAOS_SEEDS=N for more)."""
    story = {"events": 800, "every_events": 150, "batch_size": 50, "bad_every": 97,
             "errors": True}
    ref = reference_run(tmp_path / "ref", **story)
    assert ref.exists()
    for seed in range(int(os.environ.get("SEALSTREAM_CHAOS_SEEDS", "1"))):
        d = tmp_path / f"killed{seed}"
        names = make_input(d, events=800, bad_every=97)
        spec = write_spec(d, names, every_events=150, batch_size=50, errors=True)
        topics = kafka_spec(spec, kafka.bootstrap)
        # calibrate on this very job (the Kafka outputs make it slower than the reference)
        started = time.monotonic()
        calib = run(spec)
        assert calib.returncode == 0, calib.stderr
        typical = time.monotonic() - started
        shutil.rmtree(d)
        names = make_input(d, events=800, bad_every=97)
        spec = write_spec(d, names, every_events=150, batch_size=50, errors=True)
        topics = kafka_spec(spec, kafka.bootstrap)
        kills = run_killed_randomly(spec, random.Random(seed), typical, max_rounds=3,
                                    reset=lambda spec=spec: _fresh_topics(spec, kafka))
        assert kills >= 1
        topics = _topics_of(spec)
        assert_topics_match(kafka.bootstrap, topics, tmp_path / "ref")


def _topics_of(spec: Path) -> dict[str, str]:
    import tomllib

    doc = tomllib.loads(spec.read_text())
    return {s: doc[s]["topic"] for s in ("sink", "late", "errors")}


def _fresh_topics(spec: Path, kafka: Any) -> None:
    """Set the job back to its start: new, empty topics (the spec is rewritten)."""
    import re

    text = spec.read_text()
    for old in _topics_of(spec).values():
        text = text.replace(f'topic = "{old}"', f'topic = "{kafka.new_topic(2)}"')
    spec.write_text(re.sub(r"\n", "\n", text))


def test_a_zombie_is_fenced_and_its_results_never_become_visible(
        tmp_path: Path, expected: Path, kafka: Any) -> None:
    """Instance A stops inside its second epoch's transaction (rows produced, not
    committed). Instance B of the same job starts (its own checkpoint directory, as
    on another machine): its transactional producer fences A and aborts A's open
    transaction, and B runs to the end. A goes on, is refused by the broker and
    stops with a one-line error; the topics hold B's results exactly once."""
    spec, topics = _story(tmp_path, kafka.bootstrap)
    env = dict(os.environ)
    env.pop("SEALSTREAM_CRASH_AT", None)
    env["SEALSTREAM_PAUSE_AT"] = "kafka_in_transaction:2"
    a = subprocess.Popen([sys.executable, "-m", "sealstream", "run", str(spec), "--quiet"],
                         env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        _wait_stopped(a.pid)
        b_dir = tmp_path / "b"
        b_dir.mkdir()
        shutil.copytree(tmp_path / "in", b_dir / "in")
        b_spec = b_dir / "spec.toml"
        b_spec.write_text(spec.read_text())
        kafka_spec(b_spec, kafka.bootstrap, topics)
        b = run(b_spec)
        assert b.returncode == 0, b.stderr
    finally:
        os.kill(a.pid, signal.SIGCONT)
        _, err = a.communicate(timeout=120)
    assert a.returncode == 1, err
    assert "fenced" in err or "taken over" in err, err
    assert len(err.strip().splitlines()) == 1, err
    assert_topics_match(kafka.bootstrap, topics, expected)


def _wait_stopped(pid: int, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        if state == "T":
            return
        time.sleep(0.02)
    raise AssertionError(f"process {pid} did not stop at its pause point")


def test_a_transaction_the_broker_aborted_for_its_timeout_is_produced_again(
        tmp_path: Path, expected: Path, kafka: Any) -> None:
    """The run stops inside an epoch's transaction for longer than
    transaction.timeout.ms. The broker then aborts the transaction and bumps the
    producer's epoch (Kafka >= 2.5, KAFKA-6119); the test broker does not expire
    transactions by itself, so the test does what its coordinator would do: an
    InitProducerId for the same transactional.id. The run goes on, is refused, and
    stops with a one-line error; the rows were never visible, and the next run
    produces the staged epoch again."""
    from confluent_kafka import Producer

    spec, topics = _story(tmp_path, kafka.bootstrap)
    text = spec.read_text().replace(
        'path = "staging-out"',
        'path = "staging-out"\n[sink.settings]\n"transaction.timeout.ms" = 5000', 1)
    spec.write_text(text)
    env = dict(os.environ)
    env.pop("SEALSTREAM_CRASH_AT", None)
    env["SEALSTREAM_PAUSE_AT"] = "kafka_in_transaction:3"
    a = subprocess.Popen([sys.executable, "-m", "sealstream", "run", str(spec), "--quiet"],
                         env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        _wait_stopped(a.pid)
        before = read_committed(kafka.bootstrap, topics["sink"])
        # what the coordinator does to a transaction that outlived its timeout
        for output in ("results", "late", "errors"):
            Producer({"bootstrap.servers": kafka.bootstrap,
                      "transactional.id": f"sealstream-story-{output}"}).init_transactions(30)
    finally:
        os.kill(a.pid, signal.SIGCONT)
        _, err = a.communicate(timeout=120)
    assert a.returncode == 1, err
    assert "transaction.timeout.ms" in err and len(err.strip().splitlines()) == 1, err
    assert len(read_committed(kafka.bootstrap, topics["sink"])) == len(before)
    resumed = run(spec)
    assert resumed.returncode == 0, resumed.stderr
    assert_topics_match(kafka.bootstrap, topics, expected)


@pytest.mark.parametrize("point", ["after_manifest_publish:2", "after_commit_results:2"])
def test_a_zombie_paused_between_transactions_is_fenced_too(
        tmp_path: Path, expected: Path, kafka: Any, point: str) -> None:
    """Instance A stops outside any transaction (its producer made and used, an
    epoch's manifest published or a commit just made); instance B of the same job
    runs to the end; then A goes on. Its next transactional call is refused: it must
    stop with one line and never produce its epochs on top of B's (a fenced instance
    must not take the transactional.id back with a new producer)."""
    spec, topics = _story(tmp_path, kafka.bootstrap)
    env = dict(os.environ)
    env.pop("SEALSTREAM_CRASH_AT", None)
    env["SEALSTREAM_PAUSE_AT"] = point
    a = subprocess.Popen([sys.executable, "-m", "sealstream", "run", str(spec), "--quiet"],
                         env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        _wait_stopped(a.pid)
        b_dir = tmp_path / "b"
        b_dir.mkdir()
        shutil.copytree(tmp_path / "in", b_dir / "in")
        b_spec = b_dir / "spec.toml"
        b_spec.write_text(spec.read_text())
        kafka_spec(b_spec, kafka.bootstrap, topics)
        b = run(b_spec)
        assert b.returncode == 0, b.stderr
    finally:
        os.kill(a.pid, signal.SIGCONT)
        _, err = a.communicate(timeout=180)
    assert a.returncode == 1, err
    assert "fenced" in err or "taken over" in err, err
    assert len(err.strip().splitlines()) == 1, err
    assert_topics_match(kafka.bootstrap, topics, expected)


def _read_uncommitted(bootstrap: str, topic: str, timeout_s: float = 60.0) -> list[Any]:
    """Every message of ``topic`` as a ``read_uncommitted`` consumer (the Java
    clients' default) sees it: committed, aborted and still open transactions."""
    import uuid

    from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

    c: Any = Consumer({"bootstrap.servers": bootstrap, "group.id": f"t-{uuid.uuid4().hex}",
                       "isolation.level": "read_uncommitted", "enable.auto.commit": False,
                       "enable.partition.eof": True, "auto.offset.reset": "earliest"})
    out: list[Any] = []
    try:
        parts = sorted(c.list_topics(topic, timeout=timeout_s).topics[topic].partitions)
        assign = []
        for p in parts:
            lo, hi = c.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout_s,
                                             cached=False)
            if lo < hi:
                assign.append(TopicPartition(topic, p, lo))
        pending = {tp.partition for tp in assign}
        if assign:
            c.assign(assign)
        deadline = time.monotonic() + timeout_s
        while pending:
            assert time.monotonic() < deadline, f"reading {topic} did not reach its end"
            for m in c.consume(10_000, 0.5):
                err = m.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        pending.discard(m.partition())
                        continue
                    raise KafkaException(err)
                out.append(m)
    finally:
        c.close()
    return out


def test_read_uncommitted_consumers_also_see_aborted_transactions(
        tmp_path: Path, expected: Path, kafka: Any) -> None:
    """As kafka-output.md says: killed inside an epoch's transaction, the run leaves
    its rows in an aborted transaction. ``read_committed`` sees each row once;
    a ``read_uncommitted`` consumer also sees the aborted rows."""
    from sealstream.testing.kafka_read import read_committed

    spec, topics = _story(tmp_path, kafka.bootstrap)
    assert run(spec, crash_at="kafka_in_transaction:2").returncode == -9
    assert run(spec).returncode == 0
    assert_topics_match(kafka.bootstrap, topics, expected)
    extra: list[Any] = []
    for topic in topics.values():
        committed = {(m.partition, m.offset) for m in read_committed(kafka.bootstrap, topic)}
        extra += [m for m in _read_uncommitted(kafka.bootstrap, topic)
                  if (m.partition(), m.offset()) not in committed]
    # the epoch killed inside its transaction: its rows were at the broker, aborted
    # by the next run's init_transactions, and produced again in a new transaction
    assert extra, "the aborted transaction's rows are not visible read_uncommitted"
    assert all(dict(m.headers())["sealstream-token"] for m in extra)
