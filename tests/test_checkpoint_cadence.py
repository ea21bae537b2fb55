"""When checkpoints happen: ``every_events`` is reached in one step of full batches,
``every_ms`` paces the batch size so a step does not outlast the interval, and the
JSON log has one line per checkpoint however many finish between two batches.
None of it changes results."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from sealstream._runtime import engine
from sealstream._runtime.engine import Job
from sealstream.checkpoint.stores import LocalCheckpointStore
from sealstream.cli._progress import Progress
from sealstream.pipeline import load_spec
from sealstream.testing.datagen import generate
from sealstream.testing.specs import files_source, spec_text


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("cadence")
    generate(d / "in", events=60_000, keys=200, partitions=3, seed=3)
    return d


def _job(inputs: Path, d: Path, *, batch: int, every_events: int | None = None,
         every_ms: int | None = None) -> Job:
    (d / "in").symlink_to(inputs / "in")
    paths = [f"in/{p.name}" for p in sorted((inputs / "in").iterdir())]
    spec = d / "spec.toml"
    spec.write_text(spec_text("cadence", files_source(paths), batch_size=batch,
                              every_events=every_events, every_ms=every_ms, keep=100000))
    return Job(load_spec(spec))


def _results(d: Path) -> list[tuple[str, int, int, object]]:
    """Results (float sums rounded to 9 significant digits: the contract's 1e-9)."""
    rows = [json.loads(line) for f in (d / "out").glob("*.jsonl")
            for line in f.read_text().splitlines()]
    return sorted((r["key"], r["window_start"], r["n"], float(f"{r['total']:.9g}"))
                  for r in rows)


def _events_at_checkpoints(d: Path) -> list[int]:
    store = LocalCheckpointStore(d / "ckpt")
    return [int(store.read_manifest(c)["counters"]["events"]) for c in store.ids()]


def test_every_events_is_reached_in_one_step(inputs: Path, tmp_path: Path) -> None:
    """3 partitions, every 7,000 events: steps of 3 x 2,334 reach it each time (3 x
    2,333 = 6,999 took two steps, a checkpoint every 14,000 events)."""
    job = _job(inputs, tmp_path, batch=262_144, every_events=7000)
    job.run()
    at = _events_at_checkpoints(tmp_path)
    gaps = [b - a for a, b in zip([0, *at], at, strict=False)][:-1]  # the last: end of input
    assert len(gaps) >= 60_000 // 7000 - 1
    assert all(7000 <= g <= 7002 for g in gaps), gaps


def test_every_ms_paces_the_batch_size(inputs: Path, tmp_path: Path,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    ref = tmp_path / "ref"
    ref.mkdir()
    Job.run(_job(inputs, ref, batch=8192, every_events=1000000))
    paced = tmp_path / "paced"
    paced.mkdir()
    monkeypatch.setattr(engine, "MIN_PACED_BATCH", 1024)
    job = _job(inputs, paced, batch=8192, every_ms=1)  # every step outlasts it
    sizes: list[int] = []
    job.progress = lambda j: sizes.append(j.merger.batch_size)  # type: ignore[union-attr]
    job.run()
    assert sizes[:5] == [8192, 4096, 2048, 1024, 1024], sizes  # seen before each pacing
    assert _results(paced) == _results(ref)
    relaxed = tmp_path / "relaxed"
    relaxed.mkdir()
    job = _job(inputs, relaxed, batch=8192, every_ms=100000000)
    sizes = []
    job.progress = lambda j: sizes.append(j.merger.batch_size)  # type: ignore[union-attr]
    job.run()
    assert set(sizes) == {8192}  # never above the configured size
    assert _results(relaxed) == _results(ref)


def test_the_log_has_a_line_per_checkpoint(inputs: Path, tmp_path: Path) -> None:
    """Several checkpoints finishing between two looks at the job each get a line."""
    job = _job(inputs, tmp_path, batch=2000, every_events=6000)
    job.run()
    out = io.StringIO()
    Progress(tty=False, stream=out)(job)  # one look after all of them
    logged = [json.loads(line)["id"] for line in out.getvalue().splitlines()]
    assert logged == LocalCheckpointStore(tmp_path / "ckpt").ids()
    assert len(logged) > 5
