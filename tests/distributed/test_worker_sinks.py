"""Results staged by the workers: a part file per worker and epoch in the results
directory, committed by each worker after the manifest, recovered exactly once
after a SIGKILL of the coordinator between the manifest and the workers' commits,
also with another worker count."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from scenarios._story import assert_same_output as assert_same_dirs
from scenarios._story import make_input, write_spec
from sealstream.testing.specs import files_source, spec_text

WINDOW = 'kind = "tumbling"\nsize_ms = 2000\nallowed_lateness_ms = 500'
STORY = {"events": 1500, "every_events": 300, "batch_size": 100}


def _story(d: Path) -> Path:
    names = make_input(d, events=STORY["events"])
    return write_spec(d, names, window=WINDOW, every_events=STORY["every_events"],
                      batch_size=STORY["batch_size"])


def _worker_files(d: Path, pattern: str) -> list[str]:
    return sorted(p.name for p in (d / "out").glob(pattern))


def test_each_worker_stages_and_commits_its_own_part_files(
        ray_cluster: Any, tmp_path: Path, reference: Any) -> None:
    """Two workers: the committed results are the single-process ones, in files of
    worker 0 and worker 1 (``part-<epoch>-<run>w<i>.jsonl``), none left staged."""
    from sealstream import load_spec
    from sealstream.distributed import DistributedJob

    ref = reference(window=WINDOW, **STORY)
    d = tmp_path / "dist"
    job = DistributedJob(load_spec(_story(d)), workers=2)
    job.run()
    assert_same_dirs(d, ref)
    assert _worker_files(d, "part-*w0.jsonl") and _worker_files(d, "part-*w1.jsonl")
    assert not _worker_files(d, ".part-*"), "staging left behind"
    # the coordinator staged no result itself: no file of its own run token
    own = [n for n in _worker_files(d, "part-*.jsonl") if "w" not in n.split("-")[-1]]
    assert own == []


def _bytes_per_result(tmp_path: Path, label: str, aggregates: dict[str, str]) -> float:
    from sealstream import load_spec
    from sealstream.distributed import DistributedJob

    d = tmp_path / label
    (d / "in").mkdir(parents=True)
    pad = "x" * 200
    names = []
    for q in range(2):
        lines = [f'{{"user": "u{i % 50}", "ts": {1_700_000_000_000 + i * 40 + q}, '
                 f'"amount": {i % 7}, "note": "{pad}{i}"}}' for i in range(3_000)]
        (d / f"in/p{q}.jsonl").write_text("\n".join(lines) + "\n")
        names.append(f"in/p{q}.jsonl")
    spec = d / "spec.toml"
    spec.write_text(spec_text("wide", files_source(names), batch_size=200,
                              window='kind = "tumbling"\nsize_ms = 1000\n'
                                     'allowed_lateness_ms = 0',
                              aggregates=aggregates, checkpoint='path = "ckpt"',
                              every_events=2_000, keep=3))
    job = DistributedJob(load_spec(spec), workers=2)
    job.run()
    out = sum(job.merger.output_bytes)  # type: ignore[union-attr]
    fired = job.counters.windows_fired
    assert fired > 1_000
    return out / fired


def test_result_rows_do_not_pass_through_the_coordinator(
        ray_cluster: Any, tmp_path: Path) -> None:
    """What the coordinator receives per result is its identity, whatever the
    results carry: two 200-character texts more per result add nothing (they did
    when the coordinator staged the rows: about 400 bytes per result more)."""
    narrow = _bytes_per_result(tmp_path, "narrow", {"n": "count"})
    wide = _bytes_per_result(tmp_path, "wide", {
        "n": "count", "a": "first(note)", "b": "last(note)"})
    assert narrow < 100, narrow
    assert wide <= narrow + 10, (narrow, wide)


def _killed_at(d: Path, point: str, address: str, workers: int) -> str:
    env = dict(os.environ, SEALSTREAM_CRASH_AT=point)
    proc = subprocess.run(
        [sys.executable, "-m", "sealstream", "run", str(d / "spec.toml"), "--quiet",
         "--workers", str(workers), "--ray", address],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env, timeout=600)
    assert proc.returncode == -signal.SIGKILL, f"not killed at {point}: {proc.stderr}"
    return proc.stderr


def test_coordinator_killed_between_worker_commits_then_rescaled(
        ray_cluster: Any, tmp_path: Path, reference: Any) -> None:
    """``run --workers 2`` SIGKILLs itself after worker 0 committed its part of an
    epoch and before worker 1 did (worker 1's file is still staged, the manifest
    naming it is published); ``run --workers 3`` resumes: every result exactly once."""
    from sealstream import load_spec
    from sealstream.distributed import DistributedJob

    ref = reference(window=WINDOW, **STORY)
    d = tmp_path / "dist"
    _story(d)
    _killed_at(d, "after_commit_worker_part:3", ray_cluster.address, 2)
    staged = _worker_files(d, ".part-*w1.jsonl.inprogress")
    assert staged, "worker 1's part of the epoch should still be staged"
    job = DistributedJob(load_spec(d / "spec.toml"), workers=3)
    job.run()
    assert job.resumed_from is not None
    assert not _worker_files(d, ".part-*")
    assert f"{staged[0][1:-len('.inprogress')]}" in _worker_files(d, "part-*.jsonl")
    assert _worker_files(d, "part-*w2.jsonl"), "the third worker staged its own files"
    assert_same_dirs(d, ref)


def test_coordinator_killed_after_the_manifest_before_any_commit_then_rescaled(
        ray_cluster: Any, tmp_path: Path, reference: Any) -> None:
    """Killed once the second manifest is published, before any worker commits: the
    resume (3 workers) commits both workers' prepared parts, exactly once."""
    from sealstream import load_spec
    from sealstream.distributed import DistributedJob

    ref = reference(window=WINDOW, **STORY)
    d = tmp_path / "dist"
    _story(d)
    _killed_at(d, "after_manifest_publish:2", ray_cluster.address, 2)
    staged = _worker_files(d, ".part-*.inprogress")
    assert any("w0" in s for s in staged) and any("w1" in s for s in staged), staged
    job = DistributedJob(load_spec(d / "spec.toml"), workers=3)
    job.run()
    assert job.resumed_from is not None
    assert not _worker_files(d, ".part-*")
    assert_same_dirs(d, ref)


def _parquet_rows(d: Path) -> list[tuple[Any, ...]]:
    import polars as pl

    files = sorted(p for p in (d / "out").glob("part-*.parquet"))
    frame = pl.concat([pl.read_parquet(f) for f in files], how="vertical_relaxed")
    cols = ["key", "window_start", "window_end", "n", "low", "high"]
    return sorted(frame.select(cols).iter_rows())


def test_parquet_results_are_staged_per_worker(ray_cluster: Any, tmp_path: Path) -> None:
    """A Parquet results directory: files of both workers, the single-process rows."""
    from sealstream import Job, load_spec
    from sealstream.distributed import DistributedJob

    got: dict[str, list[tuple[Any, ...]]] = {}
    for label, workers in (("single", None), ("w2", 2)):
        d = tmp_path / label
        names = make_input(d, events=900)
        spec = d / "spec.toml"
        spec.write_text(spec_text(
            "pq", files_source(names), batch_size=64, window=WINDOW,
            aggregates={"n": "count", "low": "min(amount)", "high": "max(amount)"},
            sink='kind = "parquet"\npath = "out"', every_events=300, keep=3))
        pipeline = load_spec(spec)
        job = Job(pipeline) if workers is None else DistributedJob(pipeline, workers=workers)
        job.run()
        got[label] = _parquet_rows(d)
    assert got["single"] and got["w2"] == got["single"]
    d = tmp_path / "w2"
    assert list((d / "out").glob("part-*w0.parquet")) and list((d / "out").glob("part-*w1.parquet"))
