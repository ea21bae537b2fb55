"""Late events and bad records staged by the workers: a part file per worker and epoch
in the ``late`` and ``errors`` directories (written by the worker that reads the
partition), committed by each worker after the manifest; the committed rows are one
process's, exactly once after a SIGKILL of the coordinator between the manifest and
the workers' commits, also resumed with another worker count; and what the
coordinator receives does not grow with the number of late events and bad records."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from scenarios._story import assert_same_output, make_input, write_spec
from sealstream.testing.specs import files_source, spec_text

WINDOW = 'kind = "tumbling"\nsize_ms = 2000\nallowed_lateness_ms = 500'
STORY = {"events": 1500, "every_events": 300, "batch_size": 100, "errors": True,
         "bad_every": 37}


def _story(d: Path) -> Path:
    names = make_input(d, events=1500, bad_every=37)
    return write_spec(d, names, window=WINDOW, every_events=300, batch_size=100, errors=True)


def _files(d: Path, sub: str, pattern: str) -> list[str]:
    return sorted(p.name for p in (d / sub).glob(pattern))


def test_late_events_and_bad_records_staged_per_worker(ray_cluster: Any,
                                                       tmp_path: Path, reference: Any) -> None:
    """Two workers: the committed late events and bad records are one process's, in
    files of worker 0 and worker 1; the coordinator staged none, nothing left staged."""
    from sealstream import load_spec
    from sealstream.distributed import DistributedJob

    ref = reference(window=WINDOW, **STORY)
    d = tmp_path / "dist"
    job = DistributedJob(load_spec(_story(d)), workers=2)
    job.run()
    assert_same_output(d, ref)
    for sub in ("late", "errors"):
        assert _files(d, sub, "part-*w0.jsonl") and _files(d, sub, "part-*w1.jsonl"), sub
        assert not _files(d, sub, ".part-*"), f"{sub}: staging left behind"
        own = [n for n in _files(d, sub, "part-*.jsonl") if "w" not in n.split("-")[-1]]
        assert own == [], (sub, own)
    assert job.counters.late_events > 50 and job.counters.bad_records > 50


def _late_and_bad_input(d: Path, per_partition: int, late_share: float, bad_every: int
                        ) -> list[str]:
    """3 partitions, 4 keys, every event in one day-long window (nothing fires before
    the end); ``late_share`` of the events are a day old (late), a bad line every
    ``bad_every`` lines."""
    rng = random.Random(5)
    (d / "in").mkdir(parents=True)
    names = []
    for q in range(3):
        lines = []
        for i in range(per_partition):
            ts = 1_700_000_000_000 + i * 10 + q
            if i > 10 and rng.random() < late_share:
                ts -= 86_400_000 * 2
            lines.append(json.dumps({"user": f"u{i % 4}", "ts": ts, "amount": i % 7}))
            if i % bad_every == bad_every - 1:
                lines.append('{"user": "u1", "ts": "not-a-time"}')
        (d / f"in/p{q}.jsonl").write_text("\n".join(lines) + "\n")
        names.append(f"in/p{q}.jsonl")
    return names


def test_coordinator_bytes_do_not_grow_with_late_and_bad_rows(ray_cluster: Any,
                                                              tmp_path: Path) -> None:
    """The same events with a few late events and bad records, and with a third of the
    events late and a bad line every 4: the coordinator receives the same bytes per
    step (counts and references), and no output row."""
    from sealstream import load_spec
    from sealstream.distributed import DistributedJob

    per_step: dict[str, list[int]] = {}
    counts: dict[str, tuple[int, int]] = {}
    for label, share, every in (("few", 0.002, 2_000), ("many", 0.33, 4)):
        d = tmp_path / label
        names = _late_and_bad_input(d, 4_000, share, every)
        spec = d / "spec.toml"
        spec.write_text(spec_text(
            "lateb", files_source(names), batch_size=400,
            window='kind = "tumbling"\nsize_ms = 86400000\nallowed_lateness_ms = 0',
            aggregates={"n": "count"}, late=True, errors=True, checkpoint='path = "ckpt"',
            every_events=3_000, keep=3))
        job = DistributedJob(load_spec(spec), workers=2)
        job.run()
        planner = job.merger
        steps = list(planner.step_bytes)  # type: ignore[union-attr]
        assert len(steps) >= 3
        assert sum(planner.output_bytes) == 0  # type: ignore[union-attr]
        per_step[label] = steps[:-1]  # the last step fires every window
        counts[label] = (job.counters.late_events, job.counters.bad_records)
    assert counts["many"][0] > 3_000 and counts["many"][1] > 2_000, counts
    assert counts["few"][0] < 100 and counts["few"][1] < 20, counts
    few, many = max(per_step["few"]), max(per_step["many"])
    assert many <= few + 200, (few, many)


def _killed_at(d: Path, point: str, address: str, workers: int) -> None:
    env = dict(os.environ, SEALSTREAM_CRASH_AT=point)
    proc = subprocess.run(
        [sys.executable, "-m", "sealstream", "run", str(d / "spec.toml"), "--quiet",
         "--workers", str(workers), "--ray", address],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env, timeout=600)
    assert proc.returncode == -signal.SIGKILL, f"not killed at {point}: {proc.stderr}"


def test_coordinator_killed_between_record_commits_then_rescaled(
        ray_cluster: Any, tmp_path: Path, reference: Any) -> None:
    """``run --workers 2`` SIGKILLs itself after the first worker commit of late
    events (the manifest naming every worker's part is published, other parts still
    staged); ``run --workers 3`` resumes: every late event and bad record exactly
    once, and the third worker stages its own."""
    from sealstream import load_spec
    from sealstream.distributed import DistributedJob

    ref = reference(window=WINDOW, **STORY)
    d = tmp_path / "dist"
    _story(d)
    _killed_at(d, "after_commit_worker_records:1", ray_cluster.address, 2)
    staged = _files(d, "late", ".part-*.inprogress") + _files(d, "errors", ".part-*.inprogress")
    assert staged, "the epoch's other record parts should still be staged"
    job = DistributedJob(load_spec(d / "spec.toml"), workers=3)
    job.run()
    assert job.resumed_from is not None
    for sub in ("late", "errors"):
        assert not _files(d, sub, ".part-*"), sub
    assert _files(d, "late", "part-*w2.jsonl") or _files(d, "errors", "part-*w2.jsonl")
    assert_same_output(d, ref)
