"""Story: a never-ending live run (``stop = "never"``) with ``[checkpoint] every_ms``
keeps checkpointing while no input arrives (a followed file, a Kafka topic), as a
Flink job checkpoints on its interval whether or not records flow. No timing is
asserted: the test waits (with a generous deadline) until several checkpoints were
published after the input ran dry, then stops the run with SIGTERM."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from sealstream.testing.specs import spec_text, tumbling

LINES = [json.dumps({"user": "u", "ts": 1000 * i}) for i in range(5)]


def _ids(ckpt: Path) -> list[tuple[int, int]]:
    """(id, events counted) of the published checkpoints."""
    out = []
    for cp in ckpt.glob("cp-*"):
        try:
            doc = json.loads((cp / "MANIFEST.json").read_text())
            out.append((int(cp.name.split("-")[1]), int(doc["counters"]["events"])))
        except (OSError, ValueError, KeyError, IndexError):
            continue
    return sorted(out)


def _checkpoints_while_quiet(d: Path, source: str) -> None:
    spec = d / "spec.toml"
    spec.write_text(spec_text("quiet", f'{source}\nstop = "never"\npoll_ms = 20',
                              max_delay_ms=0, window=tumbling(1000), aggregates={"n": "count"},
                              every_ms=100, keep=2))
    with subprocess.Popen([sys.executable, "-m", "sealstream", "run", str(spec), "--quiet"],
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                          text=True) as proc:
        try:
            deadline = time.monotonic() + 120
            first: int | None = None
            while True:  # every event in a checkpoint; then 3 more, with nothing arriving
                assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
                ids = _ids(d / "ckpt")
                if first is None and ids and ids[-1][1] == len(LINES):
                    first = ids[-1][0]
                if first is not None and ids[-1][0] >= first + 3:
                    break
                assert time.monotonic() < deadline, (first, ids)
                time.sleep(0.05)
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=120)
        finally:
            if proc.poll() is None:  # never leave a never-ending run behind
                proc.kill()
    assert proc.returncode == 0, err
    assert all(n == len(LINES) for _, n in _ids(d / "ckpt"))


def test_a_followed_file_checkpoints_while_quiet(tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.jsonl").write_text("\n".join(LINES) + "\n")
    _checkpoints_while_quiet(tmp_path, 'kind = "jsonl"\npaths = ["in/*.jsonl"]\nfollow = true')


def test_a_kafka_topic_checkpoints_while_quiet(kafka: Any, tmp_path: Path) -> None:
    ck = pytest.importorskip("confluent_kafka")
    topic = kafka.new_topic(partitions=1)
    p = ck.Producer({"bootstrap.servers": kafka.bootstrap})
    for line in LINES:
        p.produce(topic, line.encode(), partition=0)
    assert p.flush(30) == 0
    _checkpoints_while_quiet(
        tmp_path, f'kind = "kafka"\nbootstrap = "{kafka.bootstrap}"\ntopic = "{topic}"')
