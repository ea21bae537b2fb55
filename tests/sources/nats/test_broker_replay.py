"""Story: ``sealstream replay --from PARTITION=POSITION,...`` on a live broker source.

A Kafka topic's partitions are named ``topic/N`` and their positions are offsets; a
NATS source's partitions are its subjects and their positions stream sequences. The
named partitions start at the given positions, the others where ``start`` says
(their earliest retained record here): a partition whose first records were deleted
is not refused as if position 0 had been saved for it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

SPEC = """
[pipeline]
name = "live_replay"

[source]
{source}

[watermark]
max_delay_ms = 0

[window]
kind = "tumbling"
size_ms = 1000000

[aggregates]
n = "count"
total = "sum(amount)"

[sink]
kind = "jsonl"
path = "out"

[checkpoint]
path = "ckpt"
every_ms = 200
"""


def ev(user: str, i: int) -> bytes:
    return json.dumps({"user": user, "ts": 1000 + i, "amount": float(i)}).encode()


def replay(spec: Path, origin: str, to: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sealstream", "replay", str(spec),
                           "--from", origin, "--to", str(to), "--quiet"],
                          capture_output=True, text=True, timeout=180)


def totals(d: Path) -> dict[str, tuple[int, float]]:
    out: dict[str, tuple[int, float]] = {}
    for f in sorted(d.glob("*.jsonl")):
        for line in f.read_text().splitlines():
            if line.strip():
                r = json.loads(line)
                out[r["key"]] = (r["n"], r["total"])
    return out


def test_replay_from_kafka_offsets(kafka: Any, tmp_path: Path) -> None:
    ck = pytest.importorskip("confluent_kafka")
    from confluent_kafka.admin import AdminClient

    topic = kafka.new_topic(partitions=2)
    p = ck.Producer({"bootstrap.servers": kafka.bootstrap})
    for i in range(10):
        p.produce(topic, ev("a", i), partition=0)
        p.produce(topic, ev("b", i), partition=1)
    assert p.flush(30) == 0
    # partition 1 lost its first 3 records: opened by `start`, it reads from 3
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
    for fut in admin.delete_records([ck.TopicPartition(topic, 1, 3)]).values():
        fut.result(30)
    spec = tmp_path / "spec.toml"
    spec.write_text(SPEC.format(source=(
        f'kind = "kafka"\nbootstrap = "{kafka.bootstrap}"\ntopic = "{topic}"\n'
        'stop = "never"\nkey = "user"\ntime = "ts"')))
    r = replay(spec, f"{topic}/0=6", tmp_path / "r1")
    assert r.returncode == 0, r.stderr
    assert totals(tmp_path / "r1" / "out") == {"a": (4, 30.0), "b": (7, 42.0)}
    # by index, both partitions named
    r = replay(spec, "p0=8,p1=5", tmp_path / "r2")
    assert r.returncode == 0, r.stderr
    assert totals(tmp_path / "r2" / "out") == {"a": (2, 17.0), "b": (5, 35.0)}
    # a named position below the earliest retained one is refused, never skipped
    r = replay(spec, f"{topic}/1=1", tmp_path / "r3")
    assert r.returncode == 1, r.stderr
    assert f"{topic}/1" in r.stderr and "offset 1" in r.stderr and f"{topic}/1=3" in r.stderr
    # an unknown partition: exit 2 naming the partitions there are
    r = replay(spec, f"{topic}/7=1", tmp_path / "r4")
    assert r.returncode == 2, r.stderr
    assert f"{topic}/0" in r.stderr and not (tmp_path / "r4").exists()


def test_replay_from_nats_sequences(jet: Any, tmp_path: Path) -> None:
    jet.create(["a", "b"])
    items: list[tuple[str, bytes | dict[str, Any]]] = []
    for i in range(10):
        items += [("a", ev("a", i)), ("b", ev("b", i))]
    seqs = jet.publish(items)  # a: 1,3,5,...; b: 2,4,6,...
    jet.purge(seq=3)  # sequences 1 and 2 are gone: the stream starts at 3
    spec = tmp_path / "spec.toml"
    subjects = json.dumps([jet.s("a"), jet.s("b")])
    spec.write_text(SPEC.format(source=(
        f'kind = "nats"\nservers = "{jet.url}"\nstream = "{jet.stream}"\n'
        f'subjects = {subjects}\nstop = "never"\nkey = "user"\ntime = "ts"')))
    # subject a from its 7th message (sequence 13); b, unnamed, from the stream's start
    r = replay(spec, f"{jet.s('a')}={seqs[12]}", tmp_path / "r1")
    assert r.returncode == 0, r.stderr
    assert totals(tmp_path / "r1" / "out") == {"a": (4, 30.0), "b": (9, 45.0)}
    r = replay(spec, f"p1={seqs[17]}", tmp_path / "r2")
    assert r.returncode == 0, r.stderr
    assert totals(tmp_path / "r2" / "out") == {"a": (9, 45.0), "b": (2, 17.0)}
