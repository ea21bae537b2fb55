"""Scale-out determinism with a filter and a derived key (docs/transforms.md): each
user's events split over two derived keys, a third of the events filtered out (they
still advance the watermark), sliding windows; a checkpoint chain run by 2 workers,
then 3 workers to the end, gives one process's results, late events and bad records."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from scenarios._story import assert_same_output, committed, make_input, write_spec

SLIDING = 'kind = "sliding"\nsize_ms = 3000\nslide_ms = 1000\nallowed_lateness_ms = 0'
TRANSFORM = ('[transform]\nwhere = "i % 3 <> 1"\n'
             "fields.grp = '''concat(cast(\"user\" as varchar), '-', cast(i % 2 as varchar))'''"
             "\n\n")


def _spec(d: Path) -> Path:
    names = make_input(d, events=1500, bad_every=97)
    spec = write_spec(d, names, window=SLIDING, every_events=300, batch_size=100, errors=True)
    text = spec.read_text().replace('key = "user"', 'key = "grp"')
    spec.write_text(text.replace("[window]\n", TRANSFORM + "[window]\n"))
    return spec


def test_filter_and_derived_key_with_2_then_3_workers(ray_cluster: Any, tmp_path: Path) -> None:
    from sealstream import Job, load_spec
    from sealstream.distributed import DistributedJob

    ref = tmp_path / "single"
    Job(load_spec(_spec(ref))).run()
    d = tmp_path / "dist"
    spec = _spec(d)
    job = DistributedJob(load_spec(spec), workers=2, stop_when=lambda j: True)
    job.run()
    assert job.stopped_early
    DistributedJob(load_spec(spec), workers=3).run()
    assert_same_output(d, ref)
    keys = {str(r["key"]) for r in committed(d, "out")}
    assert any(k.endswith("-0") for k in keys) and any(k.endswith("-1") for k in keys), keys
