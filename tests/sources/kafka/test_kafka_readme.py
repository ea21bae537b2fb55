"""The README's Kafka example runs as written (against the tests' broker), and the
local broker's command starts, answers and stops on a signal."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

README = Path(__file__).resolve().parents[3] / "README.md"


def _block(title: str, lang: str) -> str:
    text = README.read_text(encoding="utf-8")
    m = re.search(rf"## {re.escape(title)}\n(?:(?!\n## ).)*?```{lang}\n(.*?)```", text, re.S)
    assert m, f"README has no {lang} block under '## {title}'"
    return m.group(1)


def test_the_kafka_example_runs(kafka: Any, tmp_path: Path) -> None:
    topic = f"clicks-{uuid.uuid4().hex[:8]}"
    spec = _block("Reading a Kafka topic", "toml")
    spec = spec.replace("127.0.0.1:19092", kafka.bootstrap).replace('"clicks"', f'"{topic}"')
    (tmp_path / "clicks.toml").write_text(spec)
    lines = [x.split("#")[0].strip() for x in _block("Reading a Kafka topic", "sh").splitlines()]
    lines = [x for x in lines if x]
    assert lines[0].endswith("&") and "brokers kafka" in lines[0] and lines[-1] == "kill %1"
    for line in lines[1:-1]:  # the broker is the tests' own
        line = line.replace("127.0.0.1:19092", kafka.bootstrap).replace("clicks ", f"{topic} ")
        line = re.sub(r"^python ", f"{sys.executable} ", line)
        line = re.sub(r"^sealstream ", f"{sys.executable} -m sealstream ", line)
        res = subprocess.run(["bash", "-c", line], cwd=tmp_path, capture_output=True,
                             text=True, timeout=300)
        assert res.returncode == 0, (line, res.stderr[-2000:])
    n = sum(json.loads(x)["n"] for f in (tmp_path / "out").glob("*.jsonl")
            for x in f.read_text().splitlines())
    bad = [json.loads(x) for f in (tmp_path / "errors").glob("*.jsonl")
           for x in f.read_text().splitlines()]
    assert bad and all(b["_partition"].startswith(f"{topic}/") for b in bad)
    assert n + len(bad) == 100_000


def test_the_local_broker_command_starts_and_stops(tmp_path: Path) -> None:
    from sealstream.testing.brokers import free_port

    port = free_port()
    with subprocess.Popen(
        [sys.executable, "-m", "sealstream.testing.brokers", "kafka", "--port", str(port)],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    ) as proc:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == f"127.0.0.1:{port}"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
