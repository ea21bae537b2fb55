"""A two-source join killed and damaged: run, SIGKILL after the 3rd checkpoint, flip a
byte of the newest checkpoint's state, run again and SIGKILL after its 2nd checkpoint,
truncate the newest manifest, then SIGKILL at random instants until the run finishes.
The committed results and late events equal an uninterrupted run's, exactly once."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scenarios"))

from _join_case import CTR_FIELDS, ctr_spec, source_block  # noqa: E402
from _story import assert_same_output, newest_checkpoint, run, run_killed_randomly  # noqa: E402

#: per source: (key field, time field, value field)
FIELDS = {"clicks": CTR_FIELDS["clicks"], "views": ("ad_id", "time", "cost")}


def _input(d: Path) -> None:
    rng = random.Random(11)
    for src, (k, t, v) in FIELDS.items():
        for p in range(2):
            now = 1_700_000_000_000
            lines = []
            for _ in range(500):
                now += rng.randint(0, 300)
                ts = now - rng.randint(0, 800) - (4_000 if rng.random() < 0.03 else 0)
                rec: dict[str, Any] = {k: f"ad{rng.randint(0, 7)}", t: ts}
                if rng.random() < 0.9:
                    rec[v] = rng.choice([rng.randint(0, 20), round(rng.uniform(0, 5), 2)])
                lines.append(json.dumps(rec))
            path = d / "in" / src / f"p{p}.jsonl"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("\n".join(lines) + "\n")


def _spec() -> str:
    sources = [source_block(src, "jsonl", FIELDS[src], {"paths": [f"in/{src}/*.jsonl"]})
               for src in FIELDS]
    return ctr_spec(
        sources, left="views", batch_size=50, outputs=("late",),
        window={"kind": "sliding", "size_ms": 4000, "slide_ms": 2000,
                "allowed_lateness_ms": 500},
        aggregates={"clicks.n": "count", "clicks.bids": "sum(bid)", "views.n": "count",
                    "views.spend": "mean(cost)"},
        checkpoint={"path": "ckpt", "every_events": 150, "keep": 20})


def _story(d: Path) -> Path:
    _input(d)
    spec = d / "spec.toml"
    spec.write_text(_spec())
    return spec


def test_two_source_join_survives_kills_and_damaged_checkpoints(tmp_path: Path) -> None:
    clean = _story(tmp_path / "clean")
    started = time.monotonic()
    res = run(clean)
    assert res.returncode == 0, res.stderr
    typical = time.monotonic() - started
    ran = json.loads(subprocess.run(
        [sys.executable, "-m", "sealstream", "checkpoints", "list", str(clean.parent / "ckpt"),
         "--json"], capture_output=True, text=True).stdout)
    assert len(ran["checkpoints"]) >= 5

    spec = _story(tmp_path / "chaos")
    d = spec.parent
    assert run(spec, crash_at="after_retention:3").returncode == -9
    state = newest_checkpoint(d) / "state.arrow"
    data = bytearray(state.read_bytes())
    data[len(data) // 2] ^= 0xFF
    state.write_bytes(bytes(data))
    assert run(spec, crash_at="after_retention:2").returncode == -9
    manifest = newest_checkpoint(d) / "MANIFEST.json"
    manifest.write_bytes(manifest.read_bytes()[:40])
    kills = run_killed_randomly(spec, random.Random(5), typical)
    assert kills >= 1
    assert (d / "out").is_dir() and any((d / "ckpt" / "rejected").iterdir())
    assert_same_output(d, clean.parent)
    late = [f for f in (clean.parent / "late").glob("*.jsonl") if f.stat().st_size]
    assert late, "the story has late events"
