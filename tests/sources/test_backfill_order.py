"""A backfill (``stop = "end"``) of a live source reads its records in
``(position, partition)`` order over the whole run, as a bounded run reads files,
whatever each poll of each partition covers: a step hands out one slab of positions
from every partition that has not reached its end (docs/live.md, "Read order")."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from sealstream.testing.specs import files_source, spec_text

# Partition 0's two records span lines 0-10 (blank lines between them), partition 1's
# first two span lines 0-1. In file order, the event at line 2 of partition 1 (ts
# 15000) is judged against W = min(W_0 = 0 - 1000, W_1 = 19000) and counts; read after
# partition 0's line 10 (ts 50000), W would be 19000 and the event late.
P0 = ['{"user":"a","ts":0}', *[""] * 9, '{"user":"a","ts":50000}']
P1 = ['{"user":"b","ts":20000}', '{"user":"b","ts":20000}', '{"user":"b","ts":15000}',
      '{"user":"b","ts":20001}']


def _run(d: Path, live: bool, batch_size: int) -> tuple[list[Any], list[Any]]:
    (d / "in").mkdir(parents=True)
    for name, lines in (("p0", P0), ("p1", P1)):
        (d / "in" / f"{name}.jsonl").write_text("\n".join(lines) + "\n")
    source = files_source(["in/p0.jsonl", "in/p1.jsonl"])
    if live:
        source += '\nfollow = true\nstop = "end"'
    spec = d / "spec.toml"
    spec.write_text(spec_text("order", source, batch_size=batch_size, max_delay_ms=1000,
                              window='kind = "tumbling"\nsize_ms = 1000',
                              aggregates={"n": "count"}, late=True, every_events=1))
    res = subprocess.run([sys.executable, "-m", "sealstream", "run", str(spec), "--quiet"],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr

    def rows(sub: str) -> list[Any]:
        return sorted((json.loads(line) for f in sorted((d / sub).glob("*.jsonl"))
                       for line in f.read_text().splitlines()), key=json.dumps)

    return rows("out"), rows("late")


@pytest.mark.parametrize("batch_size", [1, 2, 3, 64])
def test_a_followed_backfill_reads_as_the_bounded_run(tmp_path: Path, batch_size: int) -> None:
    bounded = _run(tmp_path / "bounded", False, batch_size)
    assert bounded[1] == []  # the event at 15000 counts
    assert ({"key": "b", "window_start": 15_000, "window_end": 16_000, "n": 1}
            in bounded[0])
    assert _run(tmp_path / "live", True, batch_size) == bounded
