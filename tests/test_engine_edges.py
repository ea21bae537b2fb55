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
