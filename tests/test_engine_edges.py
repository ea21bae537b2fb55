"""Edge cases of the engine pinned through the command line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sealstream.cli import main

SPEC = """
[pipeline]
name = "edges"
batch_size = {batch}

[source]
kind = "jsonl"
paths = ["p.jsonl"]
key = "k"
time = "ts"

[window]
kind = "tumbling"
size_ms = 10

[aggregates]
s = "sum(v)"
m = "mean(v)"
lo = "min(v)"

[sink]
kind = "jsonl"
path = "out"

[checkpoint]
path = "ckpt"
every_events = 1
"""


def _results(d: Path) -> dict[str, dict[str, object]]:
    out = {}
    for f in sorted((d / "out").glob("*.jsonl")):
        for line in f.read_text().splitlines():
            r = json.loads(line)
            out[r["key"]] = r
    return out


@pytest.mark.parametrize("batch", [1, 64])
def test_integer_sums_past_int64_stay_exact_through_checkpoints(
    tmp_path: Path, batch: int
) -> None:
    big = 2**62
    rows = [
        {"k": "a", "ts": 1, "v": big}, {"k": "a", "ts": 2, "v": big},
        {"k": "b", "ts": 1, "v": big}, {"k": "b", "ts": 2, "v": big}, {"k": "b", "ts": 3, "v": 0.5},
        {"k": "c", "ts": 4, "v": 2}, {"k": "c", "ts": 5, "v": 2.0},
    ]
    (tmp_path / "p.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    (tmp_path / "spec.toml").write_text(SPEC.format(batch=batch))
    assert main(["run", str(tmp_path / "spec.toml"), "--quiet"]) == 0
    res = _results(tmp_path)
    assert res["a"]["s"] == 2**63 and type(res["a"]["s"]) is int
    assert res["a"]["m"] == pytest.approx(float(big))
    assert isinstance(res["b"]["s"], float) and res["b"]["s"] == pytest.approx(2.0**63 + 0.5)
    # a sum that meets a float is a float, per window; min keeps the winner's type
    assert res["c"]["s"] == 4.0 and type(res["c"]["s"]) is float
    assert res["c"]["lo"] == 2


@pytest.mark.parametrize("batch", [1, 64])
def test_event_times_at_and_beyond_the_supported_range(tmp_path: Path, batch: int) -> None:
    """Times up to 2**61 ms either side of the epoch are events whose windows fire
    at the end like any other; beyond, a valid int64 time is a bad record (its
    window's end would pass the engine's +inf, and never fire)."""
    lim = 2**61
    rows = [
        {"k": "lo", "ts": -lim, "v": 1}, {"k": "hi", "ts": lim, "v": 2},
        {"k": "x", "ts": lim + 1, "v": 3}, {"k": "y", "ts": 5 * 10**18, "v": 4},
        {"k": "z", "ts": -(2**63), "v": 5}, {"k": "f", "ts": 4.7e18, "v": 6},
        {"k": "b", "ts": 10**30, "v": 7},
    ]
    (tmp_path / "p.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    spec = SPEC.format(batch=batch) + '\n[errors]\nkind = "jsonl"\npath = "errors"\n'
    (tmp_path / "spec.toml").write_text(spec)
    assert main(["run", str(tmp_path / "spec.toml"), "--quiet"]) == 0
    res = _results(tmp_path)
    assert set(res) == {"lo", "hi"}
    lo_start = -lim // 10 * 10  # floor, below the time
    assert res["lo"]["window_start"] == lo_start and res["lo"]["window_end"] == lo_start + 10
    assert res["hi"]["window_start"] == lim - lim % 10 and res["hi"]["s"] == 2
    bad = [json.loads(line) for f in sorted((tmp_path / "errors").glob("*.jsonl"))
           for line in f.read_text().splitlines()]
    assert [b["_line"] for b in bad] == [3, 4, 5, 6, 7]
    assert all("time field 'ts' is out of range" in b["_reason"] for b in bad), bad
