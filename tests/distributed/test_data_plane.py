"""The data plane: events go from the reading worker to the key's worker, never
through the coordinator, and the output is the single-process output byte for byte.

The watermark pieces (breakpoints per partition, the per-row watermark rebuilt on a
key's worker) are checked against the single-process :func:`assign_watermarks` on
random read orders without Ray; the rest runs on the session's Ray cluster.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest

from sealstream.distributed._plane import (
    Grid,
    advance,
    breakpoints,
    prepare,
    row_watermarks,
)
from sealstream.sources._base import OFFSET, PARTITION, TIME
from sealstream.testing.specs import files_source, spec_text
from sealstream.watermark import WATERMARK, WatermarkState, assign_watermarks


def _random_steps(rng: random.Random, parts: int, steps: int, per: int
                  ) -> list[tuple[int, list[pl.DataFrame], list[int | None], list[bool]]]:
    """Steps of a bounded run: per step its bound, each partition's slab, the last
    offsets its readers know and the partitions that ended without a record."""
    columns = []
    for _ in range(parts):
        clock = rng.randint(0, 5_000)
        offs = [o for o in range(rng.randint(0, steps * per)) if rng.random() > 0.2]
        times = []
        for _ in offs:
            clock += rng.randint(-300, 700)
            times.append(clock - (4_000 if rng.random() < 0.05 else 0))
        columns.append(pl.DataFrame({OFFSET: pl.Series(offs, dtype=pl.Int64),
                                     TIME: pl.Series(times, dtype=pl.Int64)}))
    out = []
    for k in range(steps):
        lo, bound = k * per, (k + 1) * per
        slabs = [c.filter((pl.col(OFFSET) >= lo) & (pl.col(OFFSET) < bound)) for c in columns]
        lasts = [int(c[OFFSET][-1]) if c.height and int(c[OFFSET][-1]) < bound else None
                 for c in columns]
        empty = [not c.height for c in columns]
        out.append((bound, slabs, lasts, empty))
    return out


@pytest.mark.parametrize("seed", range(12))
def test_row_watermarks_equal_the_single_process_watermarks(seed: int) -> None:
    """Every row of every step gets, on whichever worker holds its key, the global
    watermark the single-process engine gives it (exact for sessions; on the grid of
    window ends plus lateness, rounded down alike, for tumbling/sliding)."""
    rng = random.Random(seed)
    parts, steps, per, delay = rng.randint(1, 4), 5, rng.randint(3, 40), rng.randint(0, 900)
    grid = None if seed % 2 else Grid.of(2_000, rng.choice([500, 1_000, 2_000]),
                                         rng.randint(0, 700))
    single = WatermarkState.initial(parts, delay)
    plane = WatermarkState.initial(parts, delay)
    for k, (bound, slabs, lasts, empty) in enumerate(_random_steps(rng, parts, steps, per)):
        drained = k == steps - 1
        breaks = [breakpoints(q, s, delay, grid, lasts[q], empty[q], drained)
                  for q, s in enumerate(slabs)]
        events = pl.concat([s.with_columns(pl.lit(q, dtype=pl.Int32).alias(PARTITION))
                            for q, s in enumerate(slabs)], how="vertical")
        for q, lo in enumerate(lasts):
            if lo is not None:
                single.last_offset[q] = lo
            elif empty[q]:
                single.exhausted[q] = True
        want = assign_watermarks(events, single, (bound - 1, parts - 1))[WATERMARK].to_numpy()
        prepare(plane, breaks)
        # any key shard: a random subset of the rows, order kept
        keep = np.array([rng.random() < 0.6 for _ in range(events.height)], dtype=np.bool_)
        got = row_watermarks(events.filter(pl.Series(keep)), plane, breaks, grid)
        got_w = got[WATERMARK].to_numpy()
        expect = want[keep] if grid is None else grid.floor(want[keep].astype(np.int64))
        assert got_w.tolist() == expect.tolist(), f"step {k}"
        finished = advance(plane, breaks, bound)
        if finished:
            single.exhausted = [True] * parts
            single.global_ms = plane.global_ms
        assert plane.current() == single.current(), f"step {k}"
        if finished:
            break


def _spec(d: Path, names: list[str], window: str, batch: int, aggregates: dict[str, str],
          *, errors: bool = False) -> Path:
    spec = d / "spec.toml"
    spec.write_text(spec_text("plane", files_source(names), batch_size=batch, window=window,
                              aggregates=aggregates, late=True, errors=errors,
                              checkpoint='path = "ckpt"', every_events=10 * batch, keep=3))
    return spec


def _lines(d: Path, sub: str) -> list[str]:
    out: list[str] = []
    for f in sorted((d / sub).glob("*.jsonl")) if (d / sub).is_dir() else []:
        if not f.name.startswith((".", "_")):
            out += [ln for ln in f.read_text().splitlines() if ln.strip()]
    return sorted(out)


WINDOWS = {
    "tumbling": 'kind = "tumbling"\nsize_ms = 2000\nallowed_lateness_ms = 500',
    "sliding": 'kind = "sliding"\nsize_ms = 3000\nslide_ms = 1000\nallowed_lateness_ms = 0',
    "session": 'kind = "session"\ngap_ms = 1500\nallowed_lateness_ms = 200',
}
EXACT = {"n": "count", "low": "min(amount)", "high": "max(amount)", "first_i": "first(i)",
         "last_i": "last(i)"}


@pytest.mark.parametrize("kind", sorted(WINDOWS))
def test_outputs_are_byte_identical_to_one_process(ray_cluster: Any, tmp_path: Path,
                                                   kind: str) -> None:
    """Counts, minima, maxima, first and last: the committed results, late events and
    bad records of 2 and 3 workers are the single-process lines, byte for byte."""
    from scenarios._story import make_input
    from sealstream import Job, load_spec
    from sealstream.distributed import DistributedJob

    runs: dict[str, Path] = {}
    for label, workers in (("single", None), ("w2", 2), ("w3", 3)):
        d = tmp_path / label
        names = make_input(d, events=900, bad_every=97)
        spec = _spec(d, names, WINDOWS[kind], 64, EXACT, errors=True)
        pipeline = load_spec(spec)
        job = Job(pipeline) if workers is None else DistributedJob(pipeline, workers=workers)
        job.run()
        runs[label] = d
    for sub in ("out", "late", "errors"):
        want = _lines(runs["single"], sub)
        assert want, sub
        for label in ("w2", "w3"):
            assert _lines(runs[label], sub) == want, (label, sub)


def _one_window_input(d: Path, per_partition: int) -> list[str]:
    """3 partitions, 4 keys, every event in one day-long window: nothing fires before
    the end, so whatever the coordinator receives per step is control, not data."""
    (d / "in").mkdir(parents=True)
    names = []
    for q in range(3):
        lines = [json.dumps({"user": f"u{i % 4}", "ts": 1_700_000_000_000 + i * 10 + q,
                             "amount": i % 7}) for i in range(per_partition)]
        (d / f"in/p{q}.jsonl").write_text("\n".join(lines) + "\n")
        names.append(f"in/p{q}.jsonl")
    return names


def test_no_event_row_passes_through_the_coordinator(ray_cluster: Any, tmp_path: Path) -> None:
    """What the coordinator receives per step does not grow with the step's events:
    the same bound holds for steps of 150 and of 12,000 events. The steps' count is
    what costs (a few Ray round trips each): the small steps' run reads 30 of them
    (1,500 events a partition), the large steps' run 3 (12,000 a partition)."""
    from sealstream import load_spec
    from sealstream.distributed import DistributedJob

    per_step: dict[int, list[int]] = {}
    for batch, per_partition in ((50, 1_500), (4_000, 12_000)):
        d = tmp_path / f"b{batch}"
        names = _one_window_input(d, per_partition)
        window = 'kind = "tumbling"\nsize_ms = 86400000\nallowed_lateness_ms = 0'
        spec = _spec(d, names, window, batch, {"n": "count", "total": "sum(amount)"})
        job = DistributedJob(load_spec(spec), workers=2)
        job.run()
        planner = job.merger
        steps = list(planner.step_bytes)  # type: ignore[union-attr]
        assert len(steps) >= max(3, per_partition // batch)
        per_step[batch] = steps[:-1]  # the last step fires every window: results
    small, big = max(per_step[50]), max(per_step[4_000])
    assert big <= 3_000 and small <= 3_000, (small, big)
    assert big <= small + 200, (small, big)  # 80 times the events, the same bytes
