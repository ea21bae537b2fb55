"""The examples under examples/ run as a newcomer runs them, and show what they say."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"


def test_agent_story_shows_the_tampered_checkpoint_refused() -> None:
    """Step 6 edits a copy of the newest checkpoint: its verdict is printed and is
    not ATOMIC (the edit used to change nothing, and the demo printed ATOMIC)."""
    pytest.importorskip("langgraph.graph")
    env = {k: v for k, v in os.environ.items()
           if k not in ("SEALSTREAM_CRASH_AT", "SEALSTREAM_ENCRYPTION_KEY")}
    env["PYTHONPATH"] = str(ROOT / "src")
    proc = subprocess.run([sys.executable, str(EXAMPLES / "agent_payment.py")], env=env,
                          capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    step6 = proc.stdout.split("== 6.", 1)[1]
    verdict = re.search(r"checkpoint \S+: (\w+) \((\w+)\)", step6)
    assert verdict is not None, step6
    assert verdict.group(1) != "ATOMIC_CHECKPOINT"
    assert verdict.groups() == ("INCONSISTENT_STATE", "SIGNATURE_MISMATCH")
    assert "tampering detected" in step6


def test_every_example_spec_keeps_its_late_events() -> None:
    """A newcomer copies the examples: each pipeline spec under examples/ has a
    [watermark] delay and a [late] output, so no event vanishes unseen."""
    specs = sorted(EXAMPLES.rglob("*.toml"))
    assert specs
    for spec in specs:
        text = spec.read_text()
        assert "\n[late]" in text and "\n[watermark]\nmax_delay_ms = " in text, spec


def test_the_kafka_example_writes_its_late_events(tmp_path: Path) -> None:
    """examples/kafka/spec.toml with its Kafka sink swapped for a directory (no broker
    needed): the generator's deliberately late events are in late/, one line each,
    as many as the summary counts; on-time events within the generator's disorder
    are not late."""
    import json

    from sealstream.testing.datagen import generate

    text = (EXAMPLES / "kafka" / "spec.toml").read_text()
    (tmp_path / "spec.toml").write_text(text.replace(
        'kind = "kafka"\nbootstrap = "127.0.0.1:9092"\ntopic = "page-views-per-minute"',
        'kind = "jsonl"\npath = "out"'))
    generate(tmp_path / "in", events=4_000, keys=20, partitions=2, late_fraction=0.01)
    summary = tmp_path / "summary.json"
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    proc = subprocess.run([sys.executable, "-m", "sealstream", "run", str(tmp_path / "spec.toml"),
                           "--quiet", "--summary-json", str(summary)], env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    late = [json.loads(x) for f in sorted((tmp_path / "late").glob("*.jsonl"))
            for x in f.read_text().splitlines()]
    assert len(late) == json.loads(summary.read_text())["late_events"] == 40
    assert all({"_partition", "_offset"} <= r.keys() for r in late)
