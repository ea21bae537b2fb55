"""Positions saved while buffers hold records of several chunks.

A partition's buffer is topped up before a batch is cut, so it can hold what is
left of an older chunk beside a newer one; chunks of different partitions have
different sizes (a reader's blocks hold fewer long lines). The position a
checkpoint saves must resume before the oldest chunk with records left, or
those records are never read again.
"""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pytest

from scenarios._story import assert_same_output, run, run_killed_randomly
from sealstream._runtime.crash import CrashPoints
from sealstream._runtime.engine import Job
from sealstream._runtime.merge import Batch, PartitionMerger, SourcePosition
from sealstream.pipeline import load_spec
from sealstream.sources._base import (
    BAD_SCHEMA,
    KEY,
    KEY_IS_INT,
    OFFSET,
    TIME,
    Chunk,
    FieldPlan,
    PartitionPosition,
    RawSpan,
)

PLAN = FieldPlan(key="k", time="t")


class Chunked:
    """Offsets 0..n-1 in chunks of the given sizes (then of max_records)."""

    def __init__(self, n: int, sizes: list[int], start: PartitionPosition) -> None:
        self.n, self.sizes, self.at, self.done = n, list(sizes), start.offset, False

    def next_chunk(self, max_records: int) -> Chunk | None:
        if self.done:
            return None
        if self.at >= self.n:
            self.done = True
            return Chunk(pl.DataFrame(schema=PLAN.event_schema()), pl.DataFrame(schema=BAD_SCHEMA),
                         None, PartitionPosition(self.n, self.n), eof=True)
        k = min(max_records, self.sizes.pop(0) if self.sizes else max_records, self.n - self.at)
        offs = list(range(self.at, self.at + k))
        events = pl.DataFrame({OFFSET: offs, KEY: ["x"] * k, KEY_IS_INT: [False] * k, TIME: offs},
                              schema=PLAN.event_schema())
        self.at += k
        self.done = self.at >= self.n
        return Chunk(events, pl.DataFrame(schema=BAD_SCHEMA), offs[-1],
                     PartitionPosition(self.at, self.at), self.done,
                     RawSpan(offs[0], offs[-1], lambda o: pl.Series([], dtype=pl.String)))

    def size_hint(self) -> None:
        return None

    def close(self) -> None:
        pass


def drain(merger: PartitionMerger, batches: int | None = None) -> tuple[list[tuple[int, int]],
                                                                         list[SourcePosition]]:
    seen: list[tuple[int, int]] = []
    positions: list[SourcePosition] = []
    done = 0
    while batches is None or done < batches:
        b: Batch | None = merger.next_batch()
        if b is None:
            break
        seen += [(int(p), int(o)) for p, o in b.events.select("__p", OFFSET).rows()]
        positions = b.positions
        done += 1
        if b.finished:
            break
    return seen, positions


@pytest.mark.parametrize("stop_after", [1, 2, 3, 4, 5, 6])
@pytest.mark.parametrize(("sizes_a", "sizes_b"), [([10] * 4, [3] * 14), ([7, 13, 2], [1, 9, 4]),
                                                  ([3] * 14, [10] * 4)])
def test_every_record_once_across_a_stop(stop_after: int, sizes_a: list[int],
                                         sizes_b: list[int]) -> None:
    n = 40
    start = [SourcePosition.start(), SourcePosition.start()]
    first = PartitionMerger([Chunked(n, sizes_a, start[0].resume),
                             Chunked(n, sizes_b, start[1].resume)], start, PLAN, 10)
    before, positions = drain(first, stop_after)
    resumed = PartitionMerger([Chunked(n, [], p.resume) for p in positions], positions, PLAN, 10)
    after, _ = drain(resumed)
    got = before + after
    assert sorted(got) == [(p, o) for p in (0, 1) for o in range(n)]  # each once


@pytest.mark.parametrize(("batch_size", "stop_at"), [(262_144, 2), (4096, 3), (4096, 8)])
def test_stop_and_resume_counts_every_event(tmp_path: Path, batch_size: int,
                                            stop_at: int) -> None:
    # short lines and long lines: the reader's blocks (1, 2, 4, 8 MiB) hold ten
    # times fewer records of the second partition
    (tmp_path / "in").mkdir()
    short = (json.dumps({"k": "a", "ts": i, "p": "x" * 70}) for i in range(50_000))
    long = (json.dumps({"k": "b", "ts": i, "p": "y" * 970}) for i in range(5_000))
    (tmp_path / "in" / "a.jsonl").write_text("".join(x + "\n" for x in short))
    (tmp_path / "in" / "b.jsonl").write_text("".join(x + "\n" for x in long))
    spec = tmp_path / "spec.toml"
    spec.write_text(
        f'[pipeline]\nname = "r"\nbatch_size = {batch_size}\n\n[source]\nkind = "jsonl"\n'
        'paths = ["in/a.jsonl", "in/b.jsonl"]\nkey = "k"\ntime = "ts"\n\n'
        '[window]\nkind = "tumbling"\nsize_ms = 1000000000\n\n'
        '[aggregates]\nn = "count"\n\n[sink]\nkind = "jsonl"\npath = "out"\n\n'
        '[checkpoint]\npath = "ckpt"\nevery_ms = 1\n'
    )
    calls = 0

    def stop(job: Job) -> bool:
        nonlocal calls
        calls += 1
        return calls == stop_at

    first = Job(load_spec(spec), crash=CrashPoints(""), stop_when=stop)
    first.run()
    assert first.stopped_early
    Job(load_spec(spec), crash=CrashPoints("")).run()
    total: dict[str, int] = {}
    for f in sorted((tmp_path / "out").glob("*.jsonl")):
        for line in f.read_text().splitlines():
            row = json.loads(line)
            total[row["key"]] = total.get(row["key"], 0) + row["n"]
    assert total == {"a": 50_000, "b": 5_000}


def test_random_sigkills_with_uneven_chunks(tmp_path: Path) -> None:
    """Real SIGKILLs at random instants over the same two uneven partitions: the
    output equals the uninterrupted run's, exactly once."""
    ref = tmp_path / "ref"
    (ref / "in").mkdir(parents=True)
    short = (json.dumps({"k": f"a{i % 7}", "ts": i * 10, "p": "x" * 60}) for i in range(20_000))
    long = (json.dumps({"k": f"b{i % 3}", "ts": i * 10, "p": "y" * 960}) for i in range(2_000))
    (ref / "in" / "a.jsonl").write_text("".join(x + "\n" for x in short))
    (ref / "in" / "b.jsonl").write_text("".join(x + "\n" for x in long))
    (ref / "spec.toml").write_text(
        '[pipeline]\nname = "r"\nbatch_size = 300\n\n[source]\nkind = "jsonl"\n'
        'paths = ["in/a.jsonl", "in/b.jsonl"]\nkey = "k"\ntime = "ts"\n\n'
        '[window]\nkind = "tumbling"\nsize_ms = 1000\n\n'
        '[aggregates]\nn = "count"\n\n[sink]\nkind = "jsonl"\npath = "out"\n\n'
        '[checkpoint]\npath = "ckpt"\nevery_events = 600\nkeep = 1000\n'
    )
    killed = tmp_path / "killed"
    shutil.copytree(ref, killed)
    started = time.monotonic()
    res = run(ref / "spec.toml")
    assert res.returncode == 0, res.stderr
    # timers drawn within this machine's own uninterrupted run (a fixed 3 s let a
    # fast machine finish before the first kill)
    kills = run_killed_randomly(killed / "spec.toml", random.Random(5),
                                typical_s=time.monotonic() - started)
    assert kills >= 1
    assert_same_output(killed, ref)
    # every checkpoint kept, across the restarts, is coherent with its parent (the
    # resume positions before the oldest buffered chunk only move forward)
    for d in (ref, killed):
        res = subprocess.run([sys.executable, "-m", "sealstream", "checkpoints", "verify",
                              str(d / "ckpt"), "--json"], capture_output=True, text=True)
        verdicts = json.loads(res.stdout)["checkpoints"]
        assert len(verdicts) > 5 and res.returncode == 0, verdicts
