"""Shared pieces of the archive stories: a Kafka job (``stop = "end"``) whose raw
records are archived, runs of it in a subprocess (a crash point makes it SIGKILL
itself), records deleted from the topic with the admin API while it is stopped, and
its committed output compared with the same events read from files."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import sealstream
from sealstream.checkpoint.manifest import KEY_ENV

SRC = Path(sealstream.__file__).resolve().parents[1]

SPEC = """
[pipeline]
name = "archived"
batch_size = {batch}

[source]
{source}
key = "user"
time = "ts"

[watermark]
max_delay_ms = 1000

[window]
kind = "tumbling"
size_ms = 10000

[aggregates]
n = "count"
total = "sum(amount)"

[sink]
kind = "jsonl"
path = "out"

[errors]
kind = "jsonl"
path = "errors"

[late]
kind = "jsonl"
path = "late"

[checkpoint]
{store}
every_events = {every}
keep = {keep}
asynchronous = false
{archive}
"""


def kafka_source(bootstrap: str, topic: str) -> str:
    return f'kind = "kafka"\nbootstrap = "{bootstrap}"\ntopic = "{topic}"\nstop = "end"'


def files_source(files: list[Path]) -> str:
    return f'kind = "jsonl"\npaths = {json.dumps([str(f) for f in files])}'


def write_spec(d: Path, source: str, *, archive: str | None = "archive", batch: int = 5,
               every: int = 10, keep: int = 3, store: str = 'path = "ckpt"',
               endpoint: str | None = None) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    section = ""
    if archive is not None:
        section = f'[archive]\nurl = "{archive}"\n'
        if endpoint:
            section += f'endpoint_url = "{endpoint}"\n'
    spec = d / "spec.toml"
    spec.write_text(SPEC.format(source=source, archive=section, batch=batch, every=every,
                                keep=keep, store=store))
    return spec


def env(extra: dict[str, str] | None = None) -> dict[str, str]:
    e = dict(os.environ)
    e["PYTHONPATH"] = str(SRC)
    for k in (KEY_ENV, "SEALSTREAM_CRASH_AT", "SEALSTREAM_PAUSE_AT", "SEALSTREAM_KEEP_PLANS"):
        e.pop(k, None)
    e.update(extra or {})
    return e


def run(spec: Path, *extra: str, crash_at: str | None = None,
        environ: dict[str, str] | None = None, timeout: float = 300
        ) -> subprocess.CompletedProcess[str]:
    e = env(environ)
    if crash_at:
        e["SEALSTREAM_CRASH_AT"] = crash_at
    return subprocess.run([sys.executable, "-m", "sealstream", "run", str(spec), "--quiet",
                           *extra], capture_output=True, text=True, timeout=timeout, env=e)


def produce_lines(bootstrap: str, topic: str, files: list[Path]) -> int:
    """File i's lines into partition i, in order."""
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    n = 0
    for i, f in enumerate(files):
        for ln in f.read_bytes().split(b"\n"):
            if ln:
                p.produce(topic, ln, partition=i)
                n += 1
    assert p.flush(60) == 0
    return n


def delete_records(bootstrap: str, topic: str, before: dict[int, int]) -> None:
    """Delete the records below ``before[partition]`` (the log start moves there)."""
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.delete_records([TopicPartition(topic, p, o) for p, o in before.items()])
    for f in futures.values():
        f.result(30)


def log_start(bootstrap: str, topic: str, partition: int) -> int:
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "archive-test-probe"})
    try:
        low, _high = c.get_watermark_offsets(TopicPartition(topic, partition), timeout=30)
    finally:
        c.close()
    return int(low)


def highest_read(ckpt: Path) -> dict[str, int]:
    """Per partition, the highest position a recorded step read up to."""
    out: dict[str, int] = {}
    for f in sorted((ckpt / "plans").glob("step-*.json")):
        for name, (_a, b) in json.loads(f.read_text())["ranges"].items():
            out[name] = max(out.get(name, 0), int(b))
    return out


def newest_checkpoint_step(ckpt: Path) -> int:
    """The last recorded step that the newest checkpoint includes."""
    newest = sorted(ckpt.glob("cp-*/MANIFEST.json"))[-1]
    return int(json.loads(newest.read_text())["plan"]["step"])


def recorded_steps(ckpt: Path) -> list[int]:
    return sorted(int(f.stem[5:]) for f in (ckpt / "plans").glob("step-*.json"))


def committed(d: Path, sub: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for f in sorted((d / sub).glob("*.jsonl")) if (d / sub).is_dir() else []:
        if not f.name.startswith((".", "_")):
            out += [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
    return out


def outcome(d: Path) -> dict[str, list[tuple[Any, ...]]]:
    """Committed results (totals to 1e-6: a float sum's last bits follow how reading
    was split into steps), late events and bad records by position: what the same
    events read from files give (partition i is file i)."""
    def part(r: dict[str, Any]) -> int:  # topic/0, a subject ending p0, a file p0.jsonl
        m = re.search(r"(\d+)(?:\.jsonl)?$", str(r["_partition"]))
        assert m is not None, r
        return int(m.group(1))
    return {
        "results": sorted((r["key"], r["window_start"], r["window_end"], r["n"],
                           round(r["total"], 6)) for r in committed(d, "out")),
        "late": sorted((part(r), r["_offset"]) for r in committed(d, "late")),
        "errors": sorted((part(r), r["_offset"]) for r in committed(d, "errors")),
    }
