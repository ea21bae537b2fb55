"""Scale-out story: a bounded run on Ray workers fires every window; lines are appended;
the job runs again with another worker count. The checkpoint's watermark (the one the
data reached, with the flush's closed_ms) restores on any count: the output equals the
same two runs in one process, exactly once (semantics section 10 and section 14)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from scenarios._story import assert_same_output as assert_same_dirs
from scenarios._story import committed, make_input, write_spec
from scenarios.test_backfill_again import _append_second_part


def test_a_second_run_after_a_flush_with_other_worker_counts(
    ray_cluster: Any, tmp_path: Path
) -> None:
    from sealstream.cli import main

    newest = 0
    for where, counts in ((tmp_path / "one", (None, None)), (tmp_path / "ray", ("2", "3"))):
        names = make_input(where, partitions=3, events=300, seed=21)
        spec = write_spec(where, names, every_events=150, batch_size=40)
        newest = max(json.loads(x)["ts"] for n in names
                     for x in (where / n).read_text().splitlines() if x.strip())
        for i, workers in enumerate(counts):
            extra = ["--workers", workers] if workers else []
            assert main(["run", str(spec), "--quiet", *extra]) == 0
            if i == 0:
                _append_second_part(where, names, seed=22)
    assert_same_dirs(tmp_path / "ray", tmp_path / "one")
    assert max(r["i"] for r in committed(tmp_path / "ray", "late")) >= 1000
    assert any(r["window_start"] > newest for r in committed(tmp_path / "ray", "out"))
    assert main(["checkpoints", "verify", str(tmp_path / "ray" / "ckpt")]) == 0
