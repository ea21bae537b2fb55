"""`checkpoints inspect` shows each partition's lag against the broker's end offset."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from test_kafka_runs import kafka_source, produce_lines, run, write_spec

from sealstream.testing.datagen import generate


def test_inspect_shows_lag_when_the_broker_answers(kafka: Any, tmp_path: Path) -> None:
    files = generate(tmp_path / "data", events=600, keys=5, partitions=2, seed=3)
    topic = kafka.new_topic(partitions=2)
    produce_lines(kafka.bootstrap, topic, files)
    k = tmp_path / "kafka"
    r = run(write_spec(k, kafka_source(kafka.bootstrap, topic)))
    assert r.returncode == 0, r.stderr
    more = generate(tmp_path / "more", events=100, keys=5, partitions=2, seed=4,
                    start_ms=1_800_000_000_000)
    produce_lines(kafka.bootstrap, topic, more)
    out = subprocess.run([sys.executable, "-m", "sealstream", "checkpoints", "inspect",
                          str(k / "ckpt"), "--json"], capture_output=True, text=True,
                         check=False)
    assert out.returncode == 0, out.stderr
    parts = json.loads(out.stdout)["partitions"]
    assert sum(p["lag"] for p in parts) == 100
