"""``sealstream run`` off a terminal: stderr is a JSON log (what supervisors and the
crash tests wait on), stdout the summary, a table or one JSON document with --json;
no stream mixes the two (a newcomer piping the output saw JSON lines and a table)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import reference as ref
from helpers import Case, jsonl, write_case

ROOT = Path(__file__).resolve().parents[1]


def _run(spec: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    return subprocess.run([sys.executable, "-m", "sealstream", "run", str(spec), *extra],
                          env=env, capture_output=True, text=True, timeout=120, check=False)


def test_off_a_terminal_each_stream_holds_one_format(tmp_path: Path) -> None:
    rows = [{"k": "ab"[i % 2], "ts": i * 100} for i in range(50)]
    case = Case(partitions=[("in/p0.jsonl", jsonl(rows))],  # type: ignore[arg-type]
                window=ref.WindowDef("tumbling", size_ms=1000), aggregates={"n": "count"},
                batch_size=5, checkpoint_every=10)
    spec = write_case(case, tmp_path)
    human = _run(spec)
    assert human.returncode == 0, human.stderr
    assert human.stdout.splitlines()[0].split() == ["pipeline", "oracle"]
    assert not any(line.lstrip().startswith("{") for line in human.stdout.splitlines())
    stderr_log = [json.loads(line) for line in human.stderr.splitlines()]  # every line JSON
    assert stderr_log[-1]["event"] == "summary"
    assert {r["event"] for r in stderr_log[:-1]} == {"checkpoint"} and len(stderr_log) > 2
    machine = _run(spec, "--start-over", "--json")
    assert machine.returncode == 0, machine.stderr
    assert json.loads(machine.stdout)["events"] == 50  # one JSON document
    log = [json.loads(line) for line in machine.stderr.splitlines()]  # every line JSON
    assert log[-1]["event"] == "summary"
    assert [r["event"] for r in log[:-1]] == ["checkpoint"] * (len(log) - 1) and len(log) > 2


def test_inspect_at_80_columns_keeps_each_time_readable(tmp_path: Path) -> None:
    """The partitions table at 80 columns: a time is its date over its time of day,
    never folded over three lines; no line is wider than the terminal."""
    rows = [{"k": "a", "ts": 1_700_000_000_000 + i * 100} for i in range(30)]
    case = Case(partitions=[("in/p0.jsonl", jsonl(rows))],  # type: ignore[arg-type]
                window=ref.WindowDef("tumbling", size_ms=1000), aggregates={"n": "count"},
                max_delay_ms=250, checkpoint_every=10)
    spec = write_case(case, tmp_path)
    assert _run(spec, "--quiet").returncode == 0
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), COLUMNS="80")
    res = subprocess.run([sys.executable, "-m", "sealstream", "checkpoints", "inspect",
                          str(tmp_path / "ckpt")], env=env, capture_output=True, text=True,
                         timeout=120, check=False)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert max(map(len, lines)) <= 80
    row = next(i for i, x in enumerate(lines) if "in/p0.jsonl" in x)
    # watermark 1_700_000_002_650, max event time 1_700_000_002_900
    assert "2023-11-14" in lines[row] and "22:13:22.650Z" in lines[row + 1]
    assert "22:13:22.900Z" in lines[row + 1]


def test_broker_partitions_have_no_bytes_read() -> None:
    """A Kafka or NATS partition has offsets, not bytes: inspect leaves the field out
    (null) instead of showing 0; a file partition keeps its byte offset."""
    from sealstream.inspect import _partitions

    def doc(kind: str) -> dict[str, object]:
        return {"definition": {"source": {"kind": kind}},
                "positions": [{"partition": "p", "next_offset": 7,
                               "resume": {"byte_offset": 0 if kind != "jsonl" else 90}}],
                "watermark": {"partition_ms": [5], "max_time": [6], "exhausted": [False]}}

    assert [p["byte_offset"] for p in _partitions(doc("kafka"))] == [None]
    assert [p["byte_offset"] for p in _partitions(doc("nats"))] == [None]
    assert [p["byte_offset"] for p in _partitions(doc("jsonl"))] == [90]
